"""Training-step and evaluation tokens/s of every scheme on the benchmark model (d=256, 4 layers,
8 heads, L=256, batch 8, byte vocabulary), with achieved FLOP/s against a float32 matmul peak
measured in the same run.

    python -m benchmarks.throughput [--schemes alibi,rope] [--seq_len 256] [--batch 8] [--dtype float32]

FLOPs per step are XLA's count for the compiled program. Writes benchmarks/results/throughput.json.
"""
from __future__ import annotations

import argparse

import posenc
from benchmarks import common
from experiment.runtime.host_memory import keep_freed_host_memory


def bench_scheme(scheme: str, seq_len: int, batch: int, dtype: str, repeats: int) -> dict:
    from models.attention import choice
    choice.PICKED.clear()
    run_train, step, state, tokens, graphdef = common.train_runner(scheme, seq_len, batch, dtype)
    train_stats = common.compiled_stats(step, state["params"], state["opt"], tokens, tokens, 0)
    attention = choice.picked()  # the path the training step runs (auto's pick), traced just now
    train_s = common.median_seconds(run_train, repeats)
    score = common.scorer(graphdef)
    eval_s = common.median_seconds(lambda: score(state["params"], tokens), repeats)
    n = batch * seq_len
    return {"scheme": scheme, "attention": attention, "train_tokens_per_s": n / train_s,
            "eval_tokens_per_s": n / eval_s,
            "train_gflop_per_step": train_stats["flops"] / 1e9,
            "train_gflop_per_s": train_stats["flops"] / train_s / 1e9}


def main():
    keep_freed_host_memory()  # before JAX (and torch) start their threads
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default=",".join(posenc.names()))
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    peak = common.matmul_peak_flops()
    print(f"float32 matmul peak measured now: {peak / 1e9:.1f} GFLOP/s")
    rows = []
    for scheme in args.schemes.split(","):
        row = bench_scheme(scheme, args.seq_len, args.batch, args.dtype, args.repeats)
        row["share_of_matmul_peak"] = row["train_gflop_per_s"] * 1e9 / peak
        rows.append(row)
        common.print_table([row], list(row))
    cols = ["scheme", "attention", "train_tokens_per_s", "eval_tokens_per_s", "train_gflop_per_step",
            "train_gflop_per_s", "share_of_matmul_peak"]
    print()
    common.print_table(rows, cols)
    path = common.write("throughput", {"model": common.BENCH_MODEL, "seq_len": args.seq_len, "batch": args.batch,
                                       "dtype": args.dtype, "matmul_peak_gflop_per_s": peak / 1e9, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
