"""What the Pallas kernel spends per logit, scheme by scheme, read off its Triton lowering (no GPU
needed): for the forward, dQ and dK / dV kernels, the operations in the Triton IR whose result is a
whole tile of logits (tensor<BxB...>: each costs B x B element operations), counted by kind.

    python -m benchmarks.kernel_cost [--block 64] [--head_dim 128] [--schemes alibi,t5]

Kinds: `float` (arith.*f: adds, multiplies, max, selects on floats), `int` (arith.*i and bit
operations: positions, masks, the dropout hash), `transcendental` (exp, log: libdevice calls or math
ops), `gather` (tt.load of a whole tile: a lookup table), `dot` (tt.dot: the two products, on the
tensor cores); layout operations (splat, broadcast, expand_dims, reshape, convert_layout) are left out.
A `lax.cond` (tiles lying `constant_beyond` back, T5) lowers both branches: both are counted, so
those numbers bound the work per tile from above. Each scheme with and without attention dropout;
bfloat16 inputs, one sequence of 512 tokens, 8 heads. Writes benchmarks/results/kernel_cost.md.
"""
from __future__ import annotations

import argparse
import collections
import re

import jax
import jax.numpy as jnp
from flax import nnx

import posenc
from models.attention.dense import Dropout
from models.attention.launches import lowering_for_a_gpu
from models.attention.pallas import Launch, pallas_attention

LAYOUT = {"tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape", "ttg.convert_layout", "tt.trans"}
KERNELS = ("forward", "dq", "dk / dv")  # the order pallas.py lowers them in


def kind(op: str) -> str | None:
    """The kind of one Triton IR operation producing a tile (None: layout, not counted)."""
    if op in LAYOUT:
        return None
    if op == "tt.dot":
        return "dot"
    if op == "tt.load":
        return "gather"
    if op == "tt.extern_elementwise" or op.startswith("math."):
        return "transcendental"
    if op.startswith("arith.") and (op.endswith("f") or op in ("arith.select",)):
        return "float"
    return "int"  # arith.*i, shifts, xor, cmpi, casts between ints, tt.addptr


def tile_ops(asm: str, block: int) -> collections.Counter:
    """{kind: count} of the operations of one Triton module whose result is a block x block tile."""
    counts = collections.Counter()
    for line in asm.splitlines():
        m = re.search(r"= ([\w\.]+)", line)
        if m and re.search(rf"(?:->|:) tensor<{block}x{block}x", line):
            k = kind(m.group(1))
            if k:
                counts[k] += 1
    return counts


def lowered_kernels(name: str, block: int, head_dim: int, dropout: bool) -> list[str]:
    """The Triton modules (forward, dQ, dK / dV) of `name`'s kernel, lowered for CUDA here."""
    from jax._src.pallas.triton import pallas_call_registration as registration
    captured, real = [], registration.lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = real(*args, **kwargs)
        captured.append(result.module.operation.get_asm())
        return result
    registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        t, h = 512, 8
        dims = posenc.ModelDims(d_model=h * head_dim, num_heads=h, head_dim=head_dim, num_layers=1, train_length=t)
        graphdef, state = nnx.split(posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0)))
        pos = jnp.arange(t, dtype=jnp.int32)[None]
        launch = Launch(block=block, interpret=False)

        def loss(state, q, k, v):
            drop = Dropout(0.1, jax.random.key(0)) if dropout else Dropout()
            return pallas_attention(q, k, v, pos, pos, nnx.merge(graphdef, state), drop, launch).astype(
                jnp.float32).sum()
        x = jax.ShapeDtypeStruct((1, t, h, head_dim), jnp.bfloat16)
        with lowering_for_a_gpu():  # jax 0.11 asks for the target GPU
            jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(state, x, x, x).lower(lowering_platforms=("cuda",))
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = real
    return captured


def main(argv=None) -> list[dict]:
    from benchmarks.check_margins import kernel_schemes
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--head_dim", type=int, default=128)
    ap.add_argument("--schemes", default="", help="comma-separated (default: every scheme the kernel takes)")
    ap.add_argument("--out", default="benchmarks/results/kernel_cost.md")
    args = ap.parse_args(argv)
    names = args.schemes.split(",") if args.schemes else kernel_schemes(512)
    kinds = ("float", "int", "transcendental", "gather", "dot")
    rows, lines = [], [f"| scheme | dropout | kernel | per-logit ops | {' | '.join(kinds)} |",
                       "|---|---|---|---:|" + "---:|" * len(kinds)]
    for name in names:
        for dropout in (False, True):
            for kernel, asm in zip(KERNELS, lowered_kernels(name, args.block, args.head_dim, dropout)):
                counts = tile_ops(asm, args.block)
                rows.append({"scheme": name, "dropout": dropout, "kernel": kernel, **counts,
                             "total": sum(counts.values())})
                lines.append(f"| {name} | {'yes' if dropout else 'no'} | {kernel} | {sum(counts.values())} | "
                             + " | ".join(str(counts.get(k, 0)) for k in kinds) + " |")
                print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
