"""Training throughput of our decoder against x-transformers (PyTorch, CPU) on the same model and
batch (d=256, 4 layers, 8 heads, FFN 1024, L=256, batch 8, byte vocabulary, tied embeddings, AdamW),
for the schemes both have. The ratio is of median tokens/s, ours / theirs (> 1: we are faster). Ours
runs with `model.attention=auto` (triangular at this length) and, for reference, with `dense`.

Two methods (`--method`), because PyTorch's OpenMP worker threads spin-wait between ops by default
(libgomp's OMP_WAIT_POLICY): in one process they keep both cores busy while our step runs, which
slowed ours by up to 13% in the old interleaved timing.
  processes (default, the fair one): each framework is timed alone, in a fresh process per
      measurement, alternating (ours, ours dense, theirs, ours, ...) for `--rounds` rounds; each
      process warms up, then times `--steps` steps; tokens/s from the median of the per-process
      medians. Nothing of the other framework is loaded, so neither slows the other, and a busy
      machine's swings still hit all of them alike, round by round.
  interleaved: the three steps built in one process and run in turns (the method of the table
      before issue #24), with `--omp_wait_policy` (PASSIVE, the default here: torch's workers sleep
      while idle; `default` leaves libgomp's, which spins, as the old table was taken).
`--omp_wait_policy` applies to the processes method too (default there: libgomp's own, as a user
runs torch); on a machine whose cores are shared with other jobs, torch's spinning workers can slow
it down many times over, so such a machine measures nothing fair either way.
Every process keeps freed host memory mapped, as our entry points do (experiment/runtime/host_memory.py).

    pip install torch==2.13.0 && pip install x-transformers   # (CPU build; or pip install -e '.[bench]')
    python -m benchmarks.vs_xtransformers [--schemes alibi,rope] [--method processes] [--rounds 5]
    python -m benchmarks.vs_xtransformers --method interleaved --omp_wait_policy PASSIVE [--repeats 15]

Writes benchmarks/results/vs_xtransformers.json (other settings: vs_xtransformers_<method>_<policy>.json).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import time

from benchmarks import common
from experiment.runtime.host_memory import keep_freed_host_memory

RUNNERS = ("ours", "ours_dense", "theirs")


def build(name: str, scheme: str, seq_len: int, batch: int):
    """The zero-argument training step of one runner."""
    if name == "theirs":
        common.torch_on_all_cores()
        return common.xtransformers_runner(scheme, seq_len, batch)
    return common.train_runner(scheme, seq_len, batch, **({"attention": "dense"} if name == "ours_dense" else {}))[0]


def time_alone(name: str, scheme: str, seq_len: int, batch: int, warmup: int, steps: int, policy: str,
               queue) -> None:
    """In a fresh process: `name`'s median step seconds over `steps` timed steps, put on `queue`."""
    set_wait_policy(policy)
    keep_freed_host_memory()
    import jax
    run = build(name, scheme, seq_len, batch)
    for _ in range(warmup):
        jax.block_until_ready(run())
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(run())
        seconds.append(time.perf_counter() - start)
    queue.put(statistics.median(seconds))


def by_processes(scheme: str, args) -> dict:
    """Median step seconds of each runner, each measured alone in alternating fresh processes."""
    seconds = {name: [] for name in RUNNERS}
    for _ in range(args.rounds):
        for name in RUNNERS:
            seconds[name].append(common.in_fresh_process(time_alone, name, scheme, args.seq_len, args.batch,
                                                         args.warmup, args.steps, args.omp_wait_policy))
    return {name: statistics.median(s) for name, s in seconds.items()} | {"per_round": seconds}


def set_wait_policy(policy: str) -> None:
    """OMP_WAIT_POLICY for torch's OpenMP threads (read when libgomp starts, with torch); `default`
    leaves the environment's."""
    if policy != "default":
        os.environ["OMP_WAIT_POLICY"] = policy


def by_interleaving(scheme: str, args) -> dict:
    runners = {name: build(name, scheme, args.seq_len, args.batch) for name in RUNNERS}
    tps = common.interleaved_tokens_per_s(runners, args.batch * args.seq_len, args.repeats, warmup=args.warmup)
    return {name: args.batch * args.seq_len / tps[name] for name in RUNNERS}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default=",".join(common.XT_SCHEMES))
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--method", choices=("processes", "interleaved"), default="processes")
    ap.add_argument("--rounds", type=int, default=5, help="processes: alternations of the three runners")
    ap.add_argument("--steps", type=int, default=5, help="processes: timed steps per process")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15, help="interleaved: timed turns")
    ap.add_argument("--omp_wait_policy", choices=("PASSIVE", "ACTIVE", "default"), default=None,
                    help="OMP_WAIT_POLICY of torch's OpenMP threads (default: PASSIVE interleaved, where they "
                         "share the process with ours; libgomp's own alone, as a user runs torch)")
    args = ap.parse_args()
    args.omp_wait_policy = args.omp_wait_policy or ("PASSIVE" if args.method == "interleaved" else "default")
    if args.method == "interleaved":
        set_wait_policy(args.omp_wait_policy)
        keep_freed_host_memory()  # before JAX (and torch) start their threads
    import torch
    tokens = args.batch * args.seq_len
    rows = []
    for scheme in args.schemes.split(","):
        measured = (by_processes if args.method == "processes" else by_interleaving)(scheme, args)
        row = {"scheme": scheme, "ours_tokens_per_s": tokens / measured["ours"],
               "xtransformers_tokens_per_s": tokens / measured["theirs"],
               "ours_over_theirs": measured["theirs"] / measured["ours"],
               "ours_dense_over_theirs": measured["theirs"] / measured["ours_dense"]}
        if "per_round" in measured:
            row["step_seconds_per_round"] = measured["per_round"]
        rows.append(row)
        common.print_table([row], [c for c in row if c != "step_seconds_per_round"])
    print()
    common.print_table(rows, ["scheme", "ours_tokens_per_s", "xtransformers_tokens_per_s", "ours_over_theirs",
                              "ours_dense_over_theirs"])
    method = {"method": args.method, "warmup": args.warmup, "omp_wait_policy": args.omp_wait_policy,
              **({"rounds": args.rounds, "steps": args.steps} if args.method == "processes" else
                 {"repeats": args.repeats})}
    fair = args.method == "processes" and args.omp_wait_policy == "default"
    name = "vs_xtransformers" + ("" if fair else f"_{args.method}_{args.omp_wait_policy.lower()}")
    path = common.write(name, {"model": common.BENCH_MODEL, "seq_len": args.seq_len, "batch": args.batch,
                               "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                               "x_transformers": importlib.metadata.version("x-transformers"),
                               **method, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
