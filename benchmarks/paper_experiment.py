"""The paper's experiment on this machine's devices, timed: `configs/wikitext103.py` as it is (the
paper's 73,728-token update, split into micro-steps to fit), trained for a few updates through the
real `train()` (memory check, sharding, metrics), then evaluated at every one of the paper's
L_valid through the real `evaluate()`.

    python -m benchmarks.paper_experiment [--scheme alibi] [--length 512] [--size 247m] [--steps 30]
        [--data DIR] [--eval_lengths all|512,1012,...] [--fsdp 1] [--shrink]

Reports tokens/s, model-FLOPs utilisation, peak device memory, the projected hours to the
paper's 286k updates, compile time, and the wall time of the evaluation. Without `--data` (a
local WikiText-103 folder with wiki.train.tokens and wiki.valid.tokens) a synthetic word corpus
with WikiText-103's vocabulary size (267,735) and validation length (217,646 tokens) stands in:
speed does not depend on the words. `--shrink` swaps in a tiny model to check the script on a CPU.
Writes benchmarks/results/paper_experiment.json.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import numpy as np

WT103_VOCAB, WT103_VALID_TOKENS, PAPER_UPDATES = 267_735, 217_646, 286_000
# --shrink: a tiny model over a 30,000-word vocabulary (also benchmarks/gpu_step.py's)
SHRINK_VOCAB = 30_000
SHRINK_MODEL = dict(num_layers=2, d_model=64, num_heads=4, mlp_dim=128, adaptive_cutoffs=(2000, 10000))


def synthetic_wikitext(folder: pathlib.Path, vocab: int, train_tokens: int, valid_tokens: int) -> None:
    """wiki.{train,valid}.tokens of Zipf-distributed words, every vocabulary word in train once."""
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(vocab)])

    def write(name: str, ids: np.ndarray) -> None:
        lines = [" ".join(words[ids[i:i + 100]]) for i in range(0, len(ids), 100)]
        (folder / name).write_text("\n".join(lines) + "\n")
    zipf = lambda n: np.minimum(rng.zipf(1.1, n) - 1, vocab - 1)
    write("wiki.train.tokens", np.concatenate([rng.permutation(vocab), zipf(train_tokens)]))
    write("wiki.valid.tokens", zipf(valid_tokens - valid_tokens // 101))  # + one <eos> per line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="alibi")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--size", default="247m")
    parser.add_argument("--steps", type=int, default=30, help="updates to time (the first 5 are warm-up)")
    parser.add_argument("--data", default="", help="local WikiText-103 folder (default: synthetic)")
    parser.add_argument("--eval_lengths", default="all", help="'all' (the paper's), 'none', or a list")
    parser.add_argument("--fsdp", type=int, default=1)
    parser.add_argument("--shrink", action="store_true", help="a tiny model (checks the script on a CPU)")
    args = parser.parse_args()

    from experiment.cli import start_runtime
    start_runtime()  # as the entry points: CPU-only malloc, compilation cache, several processes
    import jax
    from configs import wikitext103
    from experiment import evaluate, train
    from benchmarks import common

    root = pathlib.Path(tempfile.mkdtemp(prefix="paper_experiment_"))
    data = pathlib.Path(args.data) if args.data else root / "data"
    if not args.data:
        data.mkdir()
        vocab = SHRINK_VOCAB if args.shrink else WT103_VOCAB
        synthetic_wikitext(data, vocab, 200_000 if args.shrink else 3_000_000,
                           20_000 if args.shrink else WT103_VALID_TOKENS)
    config = wikitext103.get_config(f"{args.scheme},{args.length},{args.size}")
    config.data.update(dict(source="local", path=str(data)))
    config.train.update(dict(steps=args.steps, log_every=5, checkpoint_every=args.steps))
    config.mesh.fsdp = args.fsdp
    if args.shrink:
        config.model.update(SHRINK_MODEL)
    if args.eval_lengths not in ("all", "none"):
        config.eval.lengths = tuple(int(x) for x in args.eval_lengths.split(","))

    t0 = time.perf_counter()
    summary = train(config, root / "run")
    train_wall = time.perf_counter() - t0
    records = [json.loads(l) for l in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = records[1:] or records  # the first interval holds the first steps' warm-up
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in timed)
    memory_key = next(k for k in records[-1] if k.startswith("peak_"))
    result = {"scheme": args.scheme, "train_length": args.length, "size": args.size, "shrink": args.shrink,
              "data": "synthetic" if not args.data else args.data, "devices": jax.device_count(),
              "device_kind": jax.devices()[0].device_kind, "micro_steps": summary["micro_steps"],
              "params": summary["params"], "tokens_per_update": config.train.batch_size * args.length,
              "tokens_per_s": tokens_per_s, "mfu": statistics.median(r["mfu"] for r in timed) if "mfu" in timed[0] else None,
              memory_key: max(r[memory_key] for r in records), "train_wall_s": train_wall,
              "hours_to_paper_updates": PAPER_UPDATES * config.train.batch_size * args.length / tokens_per_s / 3600}
    if args.eval_lengths != "none":
        t0 = time.perf_counter()
        evaluated = evaluate(root / "run")
        result["eval_wall_s"] = time.perf_counter() - t0
        result["eval_lengths"] = [r["eval_length"] for r in evaluated]
        result["eval_tokens_per_s"] = {r["eval_length"]: r["tokens_per_s"] for r in evaluated}
    print(json.dumps({k: v for k, v in result.items() if k != "eval_tokens_per_s"}, indent=1))
    print(f"wrote {common.write('paper_experiment', result)}")


if __name__ == "__main__":
    main()
