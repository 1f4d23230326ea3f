"""Peak memory and tokens/s of evaluating ONE sequence of length L_valid = 1k ... 32k, for every
scheme, dense and blockwise attention (benchmark model: d=256, 4 layers, 8 heads, bytes).

    python -m benchmarks.long_eval_memory [--schemes alibi,rope] [--max_length 32768] [--run_up_to 32768]
        [--run_schemes alibi,rope]   # measure tokens/s for these only; the rest: planned memory only
        [--isolated_length 32768]    # also run each scheme once at this length, blockwise, in a fresh
                                     # process, for its tokens/s and that process's peak resident memory;
                                     # built for length / 64, or for length if it cannot encode 64x that
        [--isolated_schemes cope,shaw]  # ... only these

Memory is XLA's buffer assignment for the compiled evaluation program (arguments + outputs +
temporaries: what the program needs at its peak), read without running it, so dense attention's
quadratic growth is shown even where running it would not fit. Programs whose planned memory is
under --run_budget_gb are also run, for tokens/s. Writes benchmarks/results/long_eval_memory.json.
"""
from __future__ import annotations

import argparse
import resource
import time

import jax
import jax.numpy as jnp
from flax import nnx

import posenc
from benchmarks import common
from experiment.runtime.host_memory import keep_freed_host_memory


def measure(scheme: str, attention: str, length: int, run_budget: float, block: int) -> dict:
    model = common.build(scheme, train_length=length, attention=attention, attention_block=block)
    graphdef, params = nnx.split(model)
    tokens = jnp.zeros((1, length), jnp.int32)
    score = common.scorer(graphdef)
    row = {"scheme": scheme, "attention": attention, "length": length}
    try:
        stats = common.compiled_stats(score, params, tokens)
    except ValueError as e:  # a scheme that refuses blockwise attention (needs full rows)
        row["note"] = str(e).split(";")[0][:60]
        return row
    row["peak_mb"] = stats["peak_bytes"] / 2 ** 20
    if 0 < run_budget and stats["peak_bytes"] < run_budget:
        seconds = common.median_seconds(lambda: score(params, tokens), repeats=1, warmup=1)
        row["tokens_per_s"] = length / seconds
    else:
        row["note"] = "not run: over budget" if run_budget else "planned only"
    return row


def _isolated_child(scheme: str, length: int, block: int, queue) -> None:
    keep_freed_host_memory()  # as eval_extrapolate.py does
    train_length = length // 64  # evaluate at 64x the training length, where the scheme can encode it
    model = common.build(scheme, train_length=train_length, attention="blockwise", attention_block=block)
    try:
        model.scheme.check_length(length)
    except posenc.LengthError:  # a table of positions (learned absolute, ...): build it L rows long
        train_length = length
        model = common.build(scheme, train_length=train_length, attention="blockwise", attention_block=block)
    graphdef, params = nnx.split(model)
    tokens = jnp.zeros((1, length), jnp.int32)
    score = common.scorer(graphdef).lower(params, tokens).compile()  # compile first: the timed call is one run
    t0 = time.perf_counter()
    jax.block_until_ready(score(params, tokens))
    seconds = time.perf_counter() - t0
    queue.put({"train_length": train_length, "tokens_per_s": length / seconds,
               "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def run_isolated(scheme: str, length: int, block: int) -> dict:
    """Evaluate one sequence of `length` tokens blockwise in a fresh process: tokens/s of one run
    (compiled beforehand), and the peak resident memory of that whole process (JAX, compilation
    and run)."""
    row = {"scheme": scheme, "attention": "blockwise", "length": length, "isolated": True}
    try:
        row.update(common.in_fresh_process(_isolated_child, scheme, length, block))
    except RuntimeError as e:
        row["note"] = str(e)
    return row


def planned_rows(args) -> list[dict]:
    """Every (scheme, attention, length up to --max_length): planned memory, tokens/s where run."""
    lengths = [1024 * 2 ** i for i in range(16) if 1024 * 2 ** i <= args.max_length]
    rows = []
    run_schemes = set(args.run_schemes.split(",")) if args.run_schemes else None
    for scheme in args.schemes.split(","):
        for attention in args.attention.split(","):
            for length in lengths:
                run = length <= args.run_up_to and (run_schemes is None or scheme in run_schemes)
                budget = args.run_budget_gb * 2 ** 30 if run else 0
                row = measure(scheme, attention, length, budget, args.block)
                prev = next((r for r in reversed(rows) if r["scheme"] == scheme and r["attention"] == attention
                             and "peak_mb" in r), None)
                if prev and "peak_mb" in row:
                    row["growth_per_doubling"] = row["peak_mb"] / prev["peak_mb"]
                rows.append(row)
                common.print_table([row], ["scheme", "attention", "length", "peak_mb", "growth_per_doubling",
                                           "tokens_per_s", "note"])
    return rows


def isolated_rows(args) -> list[dict]:
    """Each scheme at --isolated_length, blockwise, in a fresh process."""
    rows = []
    for scheme in (args.isolated_schemes or args.schemes).split(","):
        rows.append(run_isolated(scheme, args.isolated_length, args.block))
        common.print_table(rows[-1:], ["scheme", "train_length", "length", "tokens_per_s", "process_peak_rss_mb",
                                       "note"])
    return rows


def main():
    keep_freed_host_memory()  # before JAX (and torch) start their threads
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default=",".join(posenc.names()))
    ap.add_argument("--max_length", type=int, default=32768)
    ap.add_argument("--run_up_to", type=int, default=32768, help="run (for tokens/s) only up to this length")
    ap.add_argument("--run_budget_gb", type=float, default=4.0)
    ap.add_argument("--run_schemes", default="", help="run (for tokens/s) only these schemes (default: all)")
    ap.add_argument("--attention", default="dense,blockwise")
    ap.add_argument("--tag", default="", help="suffix of the results file")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--isolated_length", type=int, default=0,
                    help="also run every scheme at this length, blockwise, each in a fresh process")
    ap.add_argument("--isolated_schemes", default="", help="only these schemes for --isolated_length")
    args = ap.parse_args()
    rows = planned_rows(args)
    if args.isolated_length:
        rows += isolated_rows(args)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    name = "long_eval_memory" + (f"_{args.tag}" if args.tag else "")
    path = common.write(name, {"model": common.BENCH_MODEL, "block": args.block, "rows": rows,
                               "process_peak_rss_mb": rss_mb, "args": vars(args)})
    print()
    common.print_table(rows, ["scheme", "attention", "train_length", "length", "peak_mb", "growth_per_doubling",
                              "tokens_per_s", "process_peak_rss_mb", "note"])
    print(f"peak resident memory of this whole process (all programs above, JAX itself included): {rss_mb:,.0f} MB")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
