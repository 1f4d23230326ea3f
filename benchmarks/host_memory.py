"""What keeping freed host memory mapped (experiment/runtime/host_memory.py) does to a training step of the
benchmark model (d=256, 4 layers, 8 heads, L=256, batch 8, byte vocabulary): ms per step, minor page
faults per step, and system / user CPU ms per step, with glibc's default malloc and with the setting.

    python -m benchmarks.host_memory [--scheme nope] [--rounds 3] [--steps 10]

malloc options are process-wide and must be set before JAX starts its threads, so each measurement
is a fresh process; the two settings alternate, `--rounds` times each, and the medians are reported.
Writes benchmarks/results/host_memory.json.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from benchmarks import common

SETTINGS = {"glibc default": "1", "kept mapped": "0"}  # value of LX_SYSTEM_MALLOC


def _child(scheme: str, steps: int, queue) -> None:
    from experiment.runtime.host_memory import keep_freed_host_memory
    applied = keep_freed_host_memory()
    import jax

    run = common.train_runner(scheme, 256, 8)[0]
    for _ in range(3):
        jax.block_until_ready(run())
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(run())
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    queue.put({"applied": applied, "ms_per_step": 1e3 * seconds / steps,
               "page_faults_per_step": (r1.ru_minflt - r0.ru_minflt) / steps,
               "system_ms_per_step": 1e3 * (r1.ru_stime - r0.ru_stime) / steps,
               "user_ms_per_step": 1e3 * (r1.ru_utime - r0.ru_utime) / steps})


def measure(scheme: str, steps: int, system_malloc: str) -> dict:
    os.environ["LX_SYSTEM_MALLOC"] = system_malloc  # read by the child's keep_freed_host_memory
    return common.in_fresh_process(_child, scheme, steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheme", default="nope")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    runs = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name, flag in SETTINGS.items():
            runs[name].append(measure(args.scheme, args.steps, flag))
    rows = []
    for name, results in runs.items():
        row = {"malloc": name, "applied": results[0]["applied"]}
        for key in ("ms_per_step", "page_faults_per_step", "system_ms_per_step", "user_ms_per_step"):
            row[key] = statistics.median(r[key] for r in results)
        rows.append(row)
    base = rows[0]["ms_per_step"]
    for row in rows:
        row["step_time_vs_default"] = row["ms_per_step"] / base
    common.print_table(rows, list(rows[0]))
    path = common.write("host_memory", {"model": common.BENCH_MODEL, "scheme": args.scheme, "seq_len": 256,
                                        "batch": 8, "rounds": args.rounds, "steps": args.steps, "rows": rows,
                                        "runs": runs})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
