"""Training-step and evaluation tokens/s of every scheme on the benchmark model (d=256, 4 layers,
8 heads, L=256, batch 8, byte vocabulary), with achieved FLOP/s against a float32 matmul peak
measured in the same run.

    python -m benchmarks.throughput [--schemes alibi,rope] [--seq_len 256] [--batch 8] [--dtype float32]

FLOPs per step are XLA's count for the compiled program. `logits ms / layer`: the forward and backward
pass of one layer's logits with every hook of the scheme (models/attention/tiles.py: tile_logits over
whole rows, the scheme's parameters differentiated too) at the same shape; `scheme share of step`: what
the scheme adds to nope's logits there, times the layers, over the scheme's training step: the part of
a slow step that is the scheme's own work (the rest is its attention path and everything else).
Writes benchmarks/results/throughput.json.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from flax import nnx

import posenc
from benchmarks import common
from experiment.runtime.host_memory import keep_freed_host_memory


def logits_seconds(scheme: str, seq_len: int, batch: int, repeats: int) -> float:
    """Forward + backward of one layer's logits (tile_logits over whole rows) of the benchmark model's
    first layer scheme, gradients to q, k and the scheme's parameters."""
    from models.attention.tiles import tile_logits
    built = common.build(scheme, train_length=seq_len)
    graphdef, state = nnx.split(built.scheme)
    heads, dim = built.cfg.num_heads, built.cfg.d_model // built.cfg.num_heads
    keys = jax.random.split(jax.random.key(0), 3)
    q, k = (jax.random.normal(key, (batch, seq_len, heads, dim)) for key in keys[:2])
    weights = jax.random.normal(keys[2], (batch, heads, seq_len, seq_len))
    pos = jnp.broadcast_to(jnp.arange(seq_len), (batch, seq_len))
    # the cotangent is an argument: as a constant, XLA would compute much of the backward pass at compile time
    grad = jax.jit(jax.grad(lambda q, k, state, weights: (tile_logits(q, k, pos, pos, nnx.merge(graphdef, state))
                                                          * weights).sum(), argnums=(0, 1, 2)))
    return common.median_seconds(lambda: jax.block_until_ready(grad(q, k, state, weights)), repeats)


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
            "train_gflop_per_s": train_stats["flops"] / train_s / 1e9, "train_step_ms": train_s * 1e3,
            "logits_ms_per_layer": logits_seconds(scheme, seq_len, batch, repeats) * 1e3}


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
    layers = common.BENCH_MODEL["num_layers"]
    nope_logits_ms = logits_seconds("nope", args.seq_len, args.batch, args.repeats) * 1e3
    rows = []
    for scheme in args.schemes.split(","):
        row = bench_scheme(scheme, args.seq_len, args.batch, args.dtype, args.repeats)
        row["share_of_matmul_peak"] = row["train_gflop_per_s"] * 1e9 / peak
        row["scheme_share_of_step"] = max(0.0, layers * (row["logits_ms_per_layer"] - nope_logits_ms)
                                          / row["train_step_ms"])
        rows.append(row)
        common.print_table([row], list(row))
    cols = ["scheme", "attention", "train_tokens_per_s", "eval_tokens_per_s", "train_gflop_per_step",
            "train_gflop_per_s", "share_of_matmul_peak", "train_step_ms", "logits_ms_per_layer",
            "scheme_share_of_step"]
    print()
    common.print_table(rows, cols)
    path = common.write("throughput", {"model": common.BENCH_MODEL, "seq_len": args.seq_len, "batch": args.batch,
                                       "dtype": args.dtype, "matmul_peak_gflop_per_s": peak / 1e9,
                                       "nope_logits_ms_per_layer": nope_logits_ms, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
