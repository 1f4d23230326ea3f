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

from benchmarks import common


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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="alibi")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--size", default="247m")
    parser.add_argument("--steps", type=int, default=30, help="updates to time (the first 5 are warm-up)")
    parser.add_argument("--data", default="", help="local WikiText-103 folder (default: synthetic)")
    parser.add_argument("--eval_lengths", default="all", help="'all' (the paper's), 'none', or a list")
    parser.add_argument("--fsdp", type=int, default=1)
    parser.add_argument("--shrink", action="store_true", help="a tiny model (checks the script on a CPU)")
    return parser.parse_args()


def data_folder(args, root: pathlib.Path) -> pathlib.Path:
    """--data, or a synthetic corpus of WikiText-103's sizes (--shrink: smaller) written under `root`."""
    if args.data:
        return pathlib.Path(args.data)
    data = root / "data"
    data.mkdir()
    vocab = common.SHRINK_VOCAB if args.shrink else common.WT103_VOCAB
    synthetic_wikitext(data, vocab, 200_000 if args.shrink else 3_000_000,
                       20_000 if args.shrink else common.WT103_VALID_TOKENS)
    return data


def experiment_config(args, data: pathlib.Path):
    """configs/wikitext103.py for --scheme, --length and --size, trained for --steps updates on `data`."""
    from configs import wikitext103
    config = wikitext103.get_config(f"{args.scheme},{args.length},{args.size}")
    config.data.update(dict(source="local", path=str(data)))
    config.train.update(dict(steps=args.steps, log_every=5, checkpoint_every=args.steps))
    config.mesh.fsdp = args.fsdp
    if args.shrink:
        config.model.update(common.SHRINK_MODEL)
    if args.eval_lengths not in ("all", "none"):
        config.eval.lengths = tuple(int(x) for x in args.eval_lengths.split(","))
    return config


def timed_training(config, run_dir: pathlib.Path, args) -> dict:
    """Train through `train()`; tokens/s and MFU (medians after the first logged interval), peak
    memory, and the hours the paper's updates would take at that speed."""
    import jax
    from experiment.train import train

    t0 = time.perf_counter()
    summary = train(config, run_dir)
    train_wall = time.perf_counter() - t0
    records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = records[1:] or records  # the first interval holds the first steps' warm-up
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in timed)
    memory_key = next(k for k in records[-1] if k.startswith("peak_"))
    tokens_per_update = config.train.batch_size * args.length
    return {"scheme": args.scheme, "train_length": args.length, "size": args.size, "shrink": args.shrink,
            "data": "synthetic" if not args.data else args.data, "devices": jax.device_count(),
            "device_kind": jax.devices()[0].device_kind, "micro_steps": summary["micro_steps"],
            "params": summary["params"], "tokens_per_update": tokens_per_update, "tokens_per_s": tokens_per_s,
            "mfu": statistics.median(r["mfu"] for r in timed) if "mfu" in timed[0] else None,
            memory_key: max(r[memory_key] for r in records), "train_wall_s": train_wall,
            "hours_to_paper_updates": common.PAPER_UPDATES * tokens_per_update / tokens_per_s / 3600}


def timed_evaluation(run_dir: pathlib.Path) -> dict:
    """Evaluate through `evaluate()` at the run's lengths: wall time and tokens/s per length."""
    from experiment.evals import evaluate

    t0 = time.perf_counter()
    evaluated = evaluate(run_dir)
    return {"eval_wall_s": time.perf_counter() - t0, "eval_lengths": [r["eval_length"] for r in evaluated],
            "eval_tokens_per_s": {r["eval_length"]: r["tokens_per_s"] for r in evaluated}}


def main() -> None:
    args = parse_args()
    from experiment.runtime.start import start_runtime
    start_runtime()  # as the entry points: CPU-only malloc, compilation cache, several processes

    root = pathlib.Path(tempfile.mkdtemp(prefix="paper_experiment_"))
    config = experiment_config(args, data_folder(args, root))
    result = timed_training(config, root / "run", args)
    if args.eval_lengths != "none":
        result.update(timed_evaluation(root / "run"))
    print(json.dumps({k: v for k, v in result.items() if k != "eval_tokens_per_s"}, indent=1))
    print(f"wrote {common.write('paper_experiment', result)}")


if __name__ == "__main__":
    main()
