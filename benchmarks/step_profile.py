"""Where one training step's time goes, ours against x-transformers, by category, from each
framework's own profiler, on the benchmark model (d=256, 4 layers, 8 heads, L=256, batch 8).

    pip install -e '.[bench]'
    python -m benchmarks.step_profile [--scheme nope] [--steps 5]

Ours: a `jax.profiler` trace of `--steps` training steps; every event is one XLA op of the compiled
step, put in a category by its HLO instruction (shape, the JAX operation it came from, and the kind
of fusion XLA made). Theirs: `torch.profiler` self CPU time of every aten op. Categories:
  dense products  the q/k/v, output and MLP projections and the tied output layer, forward and
                  backward (with their achieved GFLOP/s: 6 x tokens x weights in those products)
  attention       everything on B x H x ... tensors (logits, softmax, mask, their gradients)
  layout copies   transposes, slices, pads and concatenations outside attention
  optimizer       gradient clipping and AdamW (ours: ops outside the differentiated function)
  other           LayerNorm, GELU, residual adds, loss, bias gradients, embedding lookup
Both profilers add overhead, so each column's sum exceeds the unprofiled step time shown with it.
XLA's CPU runtime dispatches Eigen products (the weight gradients here) asynchronously: their time
is booked to whatever op runs beside them, mostly the input-gradient products, hence the GFLOP/s
of the dense products as a whole rather than per op. Writes benchmarks/results/step_profile_<scheme>.json.
"""
from __future__ import annotations

import argparse
import collections

from flax import nnx

from benchmarks import common
from experiment.runtime.host_memory import keep_freed_host_memory

CATEGORIES = ("dense products", "attention", "layout copies", "optimizer", "other")


def xla_category(name: str, shape: str, op_name: str, batch: int, heads: int) -> str:
    """The category of one instruction of the compiled step (see the module docstring)."""
    attention = shape.startswith((f"f32[{batch},{heads},", f"bf16[{batch},{heads},"))
    return common.step_category(name, op_name, attention)


def ours_profile(scheme: str, seq_len: int, batch: int, steps: int) -> dict:
    run, step, state, tokens, _ = common.train_runner(scheme, seq_len, batch)
    hlo = step.lower(state["params"], state["opt"], tokens, tokens, 0).compile().as_text()
    heads = common.BENCH_MODEL["num_heads"]
    category = common.instruction_categories(
        hlo, lambda name, shape, op: xla_category(name, shape, op, batch, heads))
    step_ms = common.median_seconds(run, max(steps, 5), warmup=2) * 1e3
    ms = common.traced_ms(run, steps, category)
    return {"step_ms": step_ms, "ms": {c: ms[c] for c in CATEGORIES}}


def theirs_profile(scheme: str, seq_len: int, batch: int, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    run = common.xtransformers_runner(scheme, seq_len, batch)
    step_ms = common.median_seconds(run, max(steps, 5), warmup=2) * 1e3
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            run()
    ms = collections.Counter()
    heads = common.BENCH_MODEL["num_heads"]
    for row in prof.key_averages(group_by_input_shape=True):
        ms[torch_category(row.key, row.input_shapes, batch, heads)] += row.self_cpu_time_total / 1e3 / steps
    return {"step_ms": step_ms, "ms": {c: ms[c] for c in CATEGORIES}}


def torch_category(name: str, shapes: list, batch: int, heads: int) -> str:
    dims = [s for s in shapes if isinstance(s, list) and s]
    if "foreach" in name or ("norm" in name and "layer_norm" not in name) or name.startswith("Optimizer"):
        return "optimizer"
    if name in ("aten::bmm", "aten::_softmax", "aten::_softmax_backward_data") or any(
            (len(s) == 4 and s[:2] == [batch, heads]) or (len(s) == 3 and s[0] == batch * heads) for s in dims):
        return "attention"
    if name in ("aten::mm", "aten::addmm"):
        return "dense products"
    if name in ("aten::copy_", "aten::cat", "aten::clone", "aten::contiguous", "aten::slice", "aten::t",
                "aten::transpose", "aten::permute"):
        return "layout copies"
    return "other"


def dense_gflop_per_step(scheme: str, seq_len: int, batch: int) -> float:
    """6 x tokens x the weights that take part in products: 2-D kernels and the tied output layer."""
    model = common.build(scheme, train_length=seq_len)
    weights = sum(p.size for path, p in nnx.to_flat_state(nnx.state(model, nnx.Param))
                  if path[-1] in ("kernel", "embedding") and p.ndim == 2)
    return 6 * batch * seq_len * weights / 1e9


def main():
    keep_freed_host_memory()  # as our entry points do; applies to torch in this process too
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheme", default="nope")
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    common.torch_on_all_cores()
    sides = {"ours": ours_profile(args.scheme, args.seq_len, args.batch, args.steps),
             "x-transformers": theirs_profile(args.scheme, args.seq_len, args.batch, args.steps)}
    gflop = dense_gflop_per_step(args.scheme, args.seq_len, args.batch)
    rows = [{"category": c, **{side: r["ms"][c] for side, r in sides.items()}} for c in CATEGORIES]
    rows.append({"category": "sum (profiled)", **{side: sum(r["ms"].values()) for side, r in sides.items()}})
    rows.append({"category": "step, unprofiled", **{side: r["step_ms"] for side, r in sides.items()}})
    rows.append({"category": "dense GFLOP/s", **{side: gflop / r["ms"]["dense products"] * 1e3
                                                 for side, r in sides.items()}})
    print(f"{args.scheme}: ms per training step (dense products: {gflop:.1f} GFLOP per step)")
    common.print_table(rows, ["category", *sides])
    path = common.write(f"step_profile_{args.scheme}", {"model": common.BENCH_MODEL, "scheme": args.scheme,
                                                         "seq_len": args.seq_len, "batch": args.batch,
                                                         "steps": args.steps, "dense_gflop_per_step": gflop,
                                                         "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
