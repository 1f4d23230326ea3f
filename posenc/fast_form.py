"""Choosing, at run time, a faster form of a positional computation that holds only for some
positions (FIRE's bias computed for one row where every row has the same positions; DeBERTa's relative
terms read along diagonals where positions are contiguous and unclipped).

Positions are traced values, so the choice is a `lax.cond`: on a CPU (where both forms were measured,
benchmarks/README.md) and a TPU a branch on the device. On a GPU a conditional may read its predicate
on the host, a synchronisation per call in the middle of a step, so there the general form runs
alone (what these schemes computed before the fast forms existed)."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def rows_alike(*positions_BxN: jax.Array) -> jax.Array:
    """Whether every row of each position array equals its first row (a traced boolean)."""
    out = jnp.bool_(True)
    for pos in positions_BxN:
        out = out & jnp.all(pos == pos[:1])
    return out


def choose(applies: jax.Array, fast: Callable[[], jax.Array], general: Callable[[], jax.Array]) -> jax.Array:
    """fast() where `applies`, else general(): both give the same values where `applies` holds."""
    if jax.default_backend() == "gpu":
        return general()
    return jax.lax.cond(applies, fast, general)
