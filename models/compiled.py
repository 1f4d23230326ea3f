"""`call`: a module's `__call__` as one compiled program (one per module structure and argument
shapes), for a model called outside any trace (models/decoder.py: `DecoderLM.compile_calls`)."""
from __future__ import annotations

import functools

import jax
from flax import nnx


@functools.lru_cache(maxsize=16)
def _program(graphdef):
    def run(state, *args):
        return nnx.merge(graphdef, state)(*args)
    return jax.jit(run)


def call(module: nnx.Module, *args):
    """`module(*args)` as one compiled program."""
    graphdef, state = nnx.split(module)
    return _program(graphdef)(state, *args)
