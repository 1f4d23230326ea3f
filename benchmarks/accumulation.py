"""What exact gradient accumulation costs: one training step of the benchmark model with dropout,
with one dropout key for the whole batch (the step before accumulation existed), with one key per
sequence (what makes the update independent of the split), and split into 2 and 4 micro-steps.
Also XLA's memory analysis of each (micro-steps hold a quarter of the activations).

    python -m benchmarks.accumulation [--scheme alibi] [--length 256] [--batch 16]

Ratios are against the first row, measured in the same process.
"""
from __future__ import annotations

import argparse

import jax
import numpy as np
from flax import nnx

from benchmarks import common
from experiment.train.optimizer import make_optimizer
from experiment.train.step import make_train_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="alibi")
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args()
    model = common.build(args.scheme, args.length, dropout=args.dropout, attention_dropout=args.dropout,
                         activation_dropout=args.dropout)
    graphdef, params = nnx.split(model)
    tx = make_optimizer(common.TRAIN)
    rng = np.random.default_rng(0)
    inputs = rng.integers(0, 256, (args.batch, args.length)).astype(np.int32)
    targets = rng.integers(0, 256, (args.batch, args.length)).astype(np.int32)

    rows = []
    for name, micro, per_example in (("one key per batch", 1, False), ("one key per sequence", 1, True),
                                     ("2 micro-steps", 2, True), ("4 micro-steps", 4, True)):
        step = make_train_step(graphdef, tx, 1, micro_steps=micro, per_example_keys=per_example)
        state = {"params": jax.tree.map(lambda x: x.copy(), params)}
        state["opt"] = tx.init(state["params"])
        stats = common.compiled_stats(step, state["params"], state["opt"], inputs, targets, 0)
        seconds = common.median_seconds(common.step_runner(step, state, inputs, targets), repeats=5)
        rows.append({"step": name, "ms": seconds * 1e3, "temp_MB": stats.get("temp_bytes", 0) / 1e6})
    for r in rows:
        r["vs_first"] = r["ms"] / rows[0]["ms"]
    common.print_table(rows, ["step", "ms", "vs_first", "temp_MB"])
    path = common.write("accumulation", {"args": vars(args), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
