"""Sharding annotations of the models' parameters (metadata only; experiment/runtime/sharding.py places them).

Parameters are annotated with the one mesh axis they may be split over, `FSDP`; a mesh with
`fsdp = 1` (or a dimension it does not divide) keeps them whole.
"""
from __future__ import annotations

from flax import nnx

FSDP = "fsdp"


def rows_sharded(init=nnx.initializers.lecun_normal()):
    """An initializer annotated to split the parameter's first dimension (a kernel's input)."""
    return nnx.with_partitioning(init, (FSDP, None))


def columns_sharded(init):
    """An initializer annotated to split the parameter's second dimension (an embedding's features,
    a projection's output)."""
    return nnx.with_partitioning(init, (None, FSDP))
