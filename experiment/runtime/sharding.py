"""The device mesh and where every array lives on it.

One `jax.sharding.Mesh` over every device of the job (all hosts), with two axes:
- `data`: batch rows are split over it;
- `fsdp`: parameters and optimizer state are split over it (the models annotate which dimension,
  with Flax NNX's `with_partitioning`), and batch rows are split over it too.
`config.mesh.fsdp = 1` (the default) keeps parameters replicated; `mesh.fsdp = N` stores
parameters and optimizer state in N shards and leaves `devices / N` for the data axis. The
training step gathers the parameters whole once per update (before its micro-steps) and reduces
gradients back to the shards; XLA inserts those collectives from the declared shardings. So what
is divided N ways is the stored state (parameters, optimizer moments); the step itself holds one
full copy of the parameters and their gradients per device.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from models.partitioning import FSDP  # the axis the models annotate

DATA = "data"
BATCH_AXES = (DATA, FSDP)  # batch rows are split over both axes


class MeshError(ValueError):
    """The mesh does not fit the devices; the message says which option to change."""


def make_mesh(fsdp: int = 1, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """A (data, fsdp) mesh over `devices` (default: every device of the job)."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if fsdp < 1 or n % fsdp:
        raise MeshError(f"mesh.fsdp={fsdp} does not divide the {n} devices; set --config.mesh.fsdp to one "
                        f"of {[d for d in range(1, n + 1) if n % d == 0]}")
    auto = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh((n // fsdp, fsdp), BATCH_AXES, axis_types=auto, devices=devices)


def mesh_from_config(config) -> jax.sharding.Mesh:
    """The mesh a run's typed config (experiment/config.py) asks for."""
    return make_mesh(int(config.mesh.fsdp))


def _fit(spec: P, shape: tuple[int, ...], mesh: jax.sharding.Mesh) -> P:
    """The annotated spec, with every axis that does not divide its dimension dropped (replicated)."""
    if len(spec) > len(shape):
        return P()
    parts = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
        parts.append(axes if names and size > 1 and dim % size == 0 else None)
    return P(*parts)


def param_shardings(state: nnx.State, mesh: jax.sharding.Mesh) -> Any:
    """NamedShardings for a model state (real or abstract), from the models' NNX annotations.
    Unannotated variables (positional-scheme tables, biases, norms) are replicated."""
    specs = nnx.get_partition_spec(state)
    return jax.tree.map(lambda spec, x: NamedSharding(mesh, _fit(spec, tuple(x.shape), mesh)),
                        specs, state, is_leaf=lambda x: isinstance(x, P))


def optimizer_shardings(tx: optax.GradientTransformation, abstract_opt_state: Any, shardings: Any,
                        mesh: jax.sharding.Mesh) -> Any:
    """The optimizer state sharded like the parameters it mirrors; counters and scalars replicated."""
    replicated = NamedSharding(mesh, P())
    return optax.tree_map_params(tx, lambda _, s: s, abstract_opt_state, shardings,
                                 transform_non_params=lambda _: replicated,
                                 is_leaf=lambda x: isinstance(x, NamedSharding))


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int = 2) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def local_rows(sharding: NamedSharding, shape: tuple[int, ...]) -> tuple[int, int]:
    """[lo, hi): the rows of a global array of `shape` that this process's devices hold."""
    spans = []
    for index in sharding.addressable_devices_indices_map(shape).values():
        rows = index[0] if index else slice(None)
        spans.append(rows.indices(shape[0])[:2])
    return min(a for a, _ in spans), max(b for _, b in spans)


def global_batch(sharding: NamedSharding, shape: tuple[int, ...],
                 read_rows: Callable[[int, int], tuple[np.ndarray, ...]]) -> tuple[jax.Array, ...]:
    """Global arrays with `shape[0]` rows (each output of `read_rows` keeps its own trailing shape),
    built from process-local data: each process reads only its own rows (`read_rows(lo, hi)`) and
    hands each device its slice."""
    lo, hi = local_rows(sharding, shape)
    local = read_rows(lo, hi)

    def build(part: np.ndarray) -> jax.Array:
        def piece(index):
            rows = index[0] if index else slice(None)
            a, b, _ = rows.indices(shape[0])
            return part[(slice(a - lo, b - lo), *index[1:])]
        return jax.make_array_from_callback((shape[0], *part.shape[1:]), sharding, piece)
    return tuple(build(part) for part in local)
