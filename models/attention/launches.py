"""Which launch configurations of the Pallas kernel (pallas.Launch) fit a device, best guess first,
and which shapes no configuration fits (`refusal`, asked by the kernel's row in paths.py).

A tile's operands live in the multiprocessor's shared memory (99 KB on consumer GPUs, 163 KB on an
A100, 227 KB on an H100), and what runs fastest differs by device, so tuning.py times a few of these
per device and workload. The forward kernel and the two backward kernels have their own tiles (the
backward ones hold more: dO, and dK / dV accumulators), so each has its own list: `forward_candidates`
(query rows x key rows: flash attention 2's 128 x 64 first), `backward_candidates` (64 x 64 first;
jax's own Pallas attention uses 32 x 32 there), each with 8 or 4 warps (8 first for 64 rows or more)
and 2 or 3 pipelining stages (1 where 2 does not fit), kept where the kernel's shared memory
(an estimate) fits the device's (`shared_memory_limit`), ordered so that the first few differ in
their tiles. LX_LAUNCH_CANDIDATES=N keeps the first N of
each list (`width`; benchmarks/first_contact.py: 1, no search).
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from models.attention.pallas import Launch, head_dim_refusal

FORWARD_TILES = ((128, 64), (64, 64), (128, 128), (64, 32), (32, 32))  # (query rows, key rows), best guess first
BACKWARD_TILES = ((64, 64), (32, 32), (128, 64), (64, 32), (128, 128))
STAGES = (2, 3)
SMALLEST_BLOCK = 16  # where no tile of the lists fits (wide heads in float32): Triton's smallest product
# Shared memory a block may use (opt-in maximum), KB, by CUDA compute capability
SHARED_MEMORY_KB = {(7, 0): 96, (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99, (9, 0): 227,
                    (10, 0): 227, (10, 3): 227, (12, 0): 99}
DEFAULT_SHARED_MEMORY_KB = 99  # a device not in the table: the smallest of current GPUs


def shared_memory_limit(device: jax.Device | None = None) -> int:
    """Bytes of shared memory a program may use on `device` (default: the first); LX_SHARED_MEMORY_KB
    overrides. From the CUDA compute capability; DEFAULT_SHARED_MEMORY_KB where it is unknown."""
    if os.environ.get("LX_SHARED_MEMORY_KB"):
        return int(float(os.environ["LX_SHARED_MEMORY_KB"]) * 1024)
    capability = getattr(device or jax.devices()[0], "compute_capability", None)
    try:
        major, minor = (int(x) for x in str(capability).split(".")[:2])
    except ValueError:
        return DEFAULT_SHARED_MEMORY_KB * 1024
    return SHARED_MEMORY_KB.get((major, minor), DEFAULT_SHARED_MEMORY_KB) * 1024


def backward_shared_memory_need(block: int, head_dim: int, itemsize: int, stages: int, keys: int | None = None) -> int:
    """Bytes of shared memory the larger backward kernel (dK / dV) needs, estimated: its key and value
    tiles (`keys` rows, default `block`), `stages` buffered query and dO tiles (the loop's pipelined
    loads, `block` rows), and P and dS as operands of its products, block x keys each."""
    keys = keys or block
    return itemsize * (2 * keys * head_dim + 2 * stages * block * head_dim + 2 * block * keys)


def forward_shared_memory_need(block: int, head_dim: int, itemsize: int, stages: int, keys: int | None = None) -> int:
    """Bytes of shared memory the forward kernel needs, estimated: its query tile, `stages` buffered
    key and value tiles (`keys` rows, default `block`), and P as an operand of its product."""
    keys = keys or block
    return itemsize * (block * head_dim + 2 * stages * keys * head_dim + block * keys)


def width() -> int:
    """How many candidates of each list a search times: LX_LAUNCH_CANDIDATES (0 or unset: all)."""
    try:
        return max(0, int(os.environ.get("LX_LAUNCH_CANDIDATES", "0")))
    except ValueError:
        return 0


def _fitting(tiles, need, head_dim: int, itemsize: int, limit: int) -> list[Launch]:
    """Every fitting (tile, warps, stages), ordered so that the first few differ in their tiles: each
    tile with its likelier warps (8 for 64 rows or more, else 4) and 2 stages first, then the other
    warps, then 3 stages (1 stage where 2 does not fit)."""
    options = []
    for block, keys in tiles:
        stages = [s for s in STAGES if need(block, head_dim, itemsize, s, keys) <= limit]
        if not stages and need(block, head_dim, itemsize, 1, keys) <= limit:
            stages = [1]
        warps = (8, 4) if max(block, keys) >= 64 else (4, 8)
        options += [((stage_rank, warp_rank), Launch(block=block, num_warps=w, num_stages=s, interpret=False,
                                                     key_block=keys))
                    for warp_rank, w in enumerate(warps) for stage_rank, s in enumerate(stages)]
    return [launch for _, launch in sorted(options, key=lambda x: x[0])]  # stable: the tiles' order kept


def _trimmed(found: list[Launch]) -> list[Launch]:
    n = width()
    return found[:n] if n else found


def forward_candidates(head_dim: int, dtype, limit: int) -> list[Launch]:
    """The forward kernel's configurations for `head_dim` in `dtype` within `limit` bytes of shared
    memory, best guess first (`width` of them)."""
    itemsize = jnp.dtype(dtype).itemsize
    found = _fitting(FORWARD_TILES, forward_shared_memory_need, head_dim, itemsize, limit)
    return _trimmed(found or _fitting(((SMALLEST_BLOCK, SMALLEST_BLOCK),), forward_shared_memory_need, head_dim,
                                      itemsize, limit))


def backward_candidates(head_dim: int, dtype, limit: int) -> list[Launch]:
    """The backward kernels' configurations (dQ and dK / dV share them), as `forward_candidates`."""
    itemsize = jnp.dtype(dtype).itemsize
    found = _fitting(BACKWARD_TILES, backward_shared_memory_need, head_dim, itemsize, limit)
    return _trimmed(found or _fitting(((SMALLEST_BLOCK, SMALLEST_BLOCK),), backward_shared_memory_need, head_dim,
                                      itemsize, limit))


def default(head_dim: int, dtype, limit: int) -> Launch | None:
    """The first forward candidate with the first backward one (None: none fits)."""
    forward, backward = forward_candidates(head_dim, dtype, limit), backward_candidates(head_dim, dtype, limit)
    if not forward or not backward:
        return None
    return forward[0].with_backward(backward[0])


def refusal(head_dim: int, dtype, limit: int) -> str | None:
    """Why the compiled kernel cannot take `head_dim` in `dtype` with `limit` bytes of shared memory,
    or None."""
    why = head_dim_refusal(head_dim)
    if why is None and not (forward_candidates(head_dim, dtype, limit) and backward_candidates(head_dim, dtype, limit)):
        need = backward_shared_memory_need(SMALLEST_BLOCK, head_dim, jnp.dtype(dtype).itemsize, 1)
        why = (f"the Pallas kernel's smallest tile ({SMALLEST_BLOCK} rows) needs about {need // 1024} KB of shared "
               f"memory for heads of {head_dim} in {jnp.dtype(dtype).name}; this device has {limit // 1024} KB: "
               f"use model.attention=auto (XLA's paths)")
    return why


def lowering_for_a_gpu(device_kind: str = "NVIDIA H100"):
    """A context in which `jit(...).trace(...).lower(lowering_platforms=("cuda",))` lowers the kernels
    to Triton without a GPU (tests, benchmarks.kernel_cost): from jax 0.11 Pallas' Triton lowering
    asks for the target GPU, given here as an abstract device of `device_kind`."""
    device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("lowering",), (jax.sharding.AxisType.Auto,), abstract_device=device)
    return jax.sharding.use_abstract_mesh(mesh)  # Auto: jax 0.11's default, Explicit, would type every sharding
