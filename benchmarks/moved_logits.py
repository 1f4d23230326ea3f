"""The cost of the training-free methods that move logits to other positions (Self-Extend, DCA, ReRoPE:
posenc/rotary.py, `Rope.bias`) in one layer's attention, against plain RoPE: blockwise attention with and
without the per-tile skip (a tile where a move takes no pair computes none of its far logits; the baseline
computes them in every tile, as before the skip), and the CPU flash kernel (`Rope.position_variants`:
each pair's logit computed once, from the variant of q and k its positions pick; grouped keys, 3 heads
as SmolLM2's), all in one process, in turns, best of `--rounds`.

    python -m benchmarks.moved_logits [--length 8192] [--block 512] [--rounds 3]

SmolLM2-135M's attention shape (9 heads of 64, one row) and its methods' settings at twice its 8,192
window (common.MOVED_METHODS, as experiment/evals/methods.py sets them: Self-Extend W = 2,048, G = 4;
DCA chunks 6,144, local window 512; ReRoPE window 512). Writes benchmarks/results/moved_logits.json.
"""
from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp

from benchmarks import common
from models.attention import blockwise_attention, cpu_flash, native
from models.attention.call import Call


def every_tile(pred, yes, no, *operands):
    """lax.cond as it was before the skip, for the moves: the far logits of every tile computed."""
    return yes(*operands)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    q, k, v = (jax.random.normal(key, (1, args.length, 9, 64)) for key in jax.random.split(jax.random.key(0), 3))
    pos = jnp.broadcast_to(jnp.arange(args.length, dtype=jnp.int32), (1, args.length))
    programs = {}
    for name, options in common.MOVED_METHODS.items():
        for skip in ((True, False) if options else (True,)):
            s = common.smollm2_rope(options)
            cond, jax.lax.cond = jax.lax.cond, (jax.lax.cond if skip else every_tile)
            try:  # traced now, with the cond of this variant
                f = jax.jit(lambda q, k, v, s=s: blockwise_attention(q, k, v, pos, pos, s, args.block))
                programs[(name, skip)] = f.lower(q, k, v).compile()
            finally:
                jax.lax.cond = cond
    if native.unavailable() is None:
        k3, v3 = k[:, :, ::3], v[:, :, ::3]  # SmolLM2's 3 key-value heads, read in place by the kernel
        for name, options in common.MOVED_METHODS.items():
            s = common.smollm2_rope(options)
            f = jax.jit(lambda q, k, v, s=s: cpu_flash.cpu_flash_call(q, k, v, Call(pos, pos, s)))
            programs[(name, "cpu_flash")] = functools.partial(f.lower(q, k3, v3).compile(), q, k3, v3)
    best = {key: float("inf") for key in programs}
    for _ in range(args.rounds):
        for key, f in programs.items():
            start = time.perf_counter()
            jax.block_until_ready(f() if key[1] == "cpu_flash" else f(q, k, v))
            best[key] = min(best[key], time.perf_counter() - start)
    rows = []
    for (name, variant), t in best.items():
        flash = variant == "cpu_flash"
        rows.append({"method": name, "path": "cpu_flash" if flash else "blockwise",
                     "tiles": "-" if flash else "skip" if variant else "every", "seconds": t,
                     "vs_rope": t / best[("rope", variant if flash else True)],  # RoPE on the same path
                     "vs_every_tile": t / best[(name, False)] if variant is True and (name, False) in best else None,
                     "vs_blockwise": t / best[(name, True)] if flash else None})
    common.print_table(rows, ["method", "path", "tiles", "seconds", "vs_rope", "vs_every_tile", "vs_blockwise"])
    print("wrote", common.write("moved_logits", {"length": args.length, "block": args.block, "rows": rows}))


if __name__ == "__main__":
    main()
