"""The cost of one decoding step of the training-free methods that move positions (Self-Extend, DCA,
ReRoPE) in one layer's attention against a long cache, against plain RoPE: with the cache keeping each
move's keys (models/generation/cache.py `moved_k`: each logit from the variant its positions pick) and
as before, rotating every cached key on by each move for each new token (`Rope.bias` over the cache;
still the path of a wrapped scheme such as log-n around Self-Extend), all in one process, in turns,
best of `--rounds` (each round `--steps` steps).

    python -m benchmarks.moved_decode [--length 16384] [--rounds 3] [--steps 8]

SmolLM2-135M's attention shape (9 query heads, 3 key-value heads of 64, one row, float32) and its
methods' settings at twice its 8,192 window (common.MOVED_METHODS, as benchmarks/moved_logits.py). Writes
benchmarks/results/moved_decode.json.
"""
from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks import common
from models.generation import attend
from models.generation.cache import CacheShape, LayerCache
from models.generation.session import _cpu_options


def filled_cache(s, length: int, moved: int) -> LayerCache:
    """One row's cache of `length` random keys and values (and one free slot per step to come)."""
    shape = CacheShape(1, length + 64, 3, 64, 64, 64, jnp.float32, moved)
    cache = LayerCache(shape, None)
    q, k, v = (jax.random.normal(key, (1, length, n, 64)) for key, n in zip(jax.random.split(jax.random.key(0), 3),
                                                                          (9, 3, 3)))
    cache.length[...] = jnp.full((1,), length, jnp.int32)
    attend.prefill(cache, s, q, k, v, jnp.arange(length, dtype=jnp.int32)[None])
    return cache


def step_program(s, cache: LayerCache):
    """A compiled decoding step: (cache state, q, k, v, position) -> (output, the state after it)."""
    graph, state = nnx.split(cache)

    # written in place, compiled as a Session's step is
    @functools.partial(jax.jit, donate_argnums=0, compiler_options=_cpu_options())
    def step(state, q, k, v, position):
        cache = nnx.merge(graph, state)
        out = attend.decode(cache, s, q, k, v, position)
        return out, nnx.split(cache)[1]
    return step, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    q, k, v = (jax.random.normal(key, (1, 1, n, 64)) for key, n in zip(jax.random.split(jax.random.key(1), 3),
                                                                     (9, 3, 3)))
    runs = {}
    for name, options in common.MOVED_METHODS.items():
        s = common.smollm2_rope(options)
        moves = len(jax.eval_shape(s.position_variants, q, q, jnp.zeros((1, 1), jnp.int32),
                                   jnp.zeros((1, 1), jnp.int32)).ks) - 1 if options else 0
        for kept in ((True, False) if options else (True,)):
            runs[(name, kept)] = step_program(s, filled_cache(s, args.length, moves if kept else 0))
    best = {key: float("inf") for key in runs}
    for _ in range(args.rounds):
        for key, (step, filled) in runs.items():
            state = jax.tree.map(jnp.copy, filled)  # each round from the same filled cache
            out, state = step(state, q, k, v, jnp.full((1, 1), args.length, jnp.int32))  # compiled, warm
            jax.block_until_ready(out)
            start = time.perf_counter()
            for i in range(args.steps):
                out, state = step(state, q, k, v, jnp.full((1, 1), args.length + 1 + i, jnp.int32))
            jax.block_until_ready(out)
            best[key] = min(best[key], (time.perf_counter() - start) / args.steps)
    label = lambda name, kept: "no moves" if name == "rope" else "moved keys kept" if kept else "rotated per step"
    rows = [{"method": name, "cache": label(name, kept), "ms_per_step": t * 1e3,
             "vs_rope": t / best[("rope", True)],
             "vs_rotated": t / best[(name, False)] if kept and (name, False) in best else None}
            for (name, kept), t in best.items()]
    common.print_table(rows, ["method", "cache", "ms_per_step", "vs_rope", "vs_rotated"])
    print("wrote", common.write("moved_decode", {"length": args.length, "steps": args.steps, "rows": rows}))


if __name__ == "__main__":
    main()
