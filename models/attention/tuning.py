"""The Pallas kernel's launch configuration per device, chosen by a small search the first time a
(device kind, scheme with its options, head dimension, dtype) is met, and cached.

A fixed tile of 64 rows with 4 warps and 2 pipelining stages fits some GPUs and head dimensions
and not others: a tile's operands live in the multiprocessor's shared memory (99 KB on consumer
GPUs, 163 KB on an A100, 227 KB on an H100), and what runs fastest differs by device. Candidates:
tiles of 32, 64 or 128 rows (queries and keys alike; 16 where none of those fits), 4 or 8 warps (8
for tiles of 64 rows or more), 2 or 3 stages (1 where 2 does not fit), kept where the kernels'
shared memory (`shared_memory_need`, an estimate) fits the device's (`shared_memory_limit`). Each is compiled and timed on a forward and
backward pass (`SEARCH_SHAPE`); one that fails to compile is dropped with its error; from the
fastest down, the first that passes the numerical check (verify.py) is chosen. Head dimensions the
kernel cannot take, or for which no candidate fits, are refused with the reason (`refusal`).

The result is cached like the check's verdicts (in memory and in JAX's compilation cache folder,
verify.cache_folder), so the search (a few seconds per candidate on a GPU) runs once per machine.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.attention import pallas, verify
from models.attention.pallas import Launch, pallas_attention
from models.attention.verify import Verdict
from posenc import Scheme

BLOCKS, WARPS, STAGES = (32, 64, 128), (4, 8), (2, 3)
SMALLEST_BLOCK = 16  # where no tile of BLOCKS fits (wide heads in float32): Triton's smallest product
# Shared memory a block may use (opt-in maximum), KB, by CUDA compute capability
SHARED_MEMORY_KB = {(7, 0): 96, (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99, (9, 0): 227,
                    (10, 0): 227, (10, 3): 227, (12, 0): 99}
DEFAULT_SHARED_MEMORY_KB = 99  # a device not in the table: the smallest of current GPUs
SEARCH_SHAPE = (2, 1024)  # sequences and tokens of the timed forward and backward pass


@dataclasses.dataclass(frozen=True)
class Tuned:
    """A search's outcome: the launch to use (None: none compiled), the check's verdict on it, the
    time of every candidate (ms per forward and backward) or the error that dropped it, and the
    faster candidates that failed the check, with why."""
    launch: Launch | None
    verdict: Verdict
    timings: dict = dataclasses.field(default_factory=dict)
    rejected: dict = dataclasses.field(default_factory=dict)


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


def shared_memory_need(block: int, head_dim: int, itemsize: int, stages: int) -> int:
    """Bytes of shared memory the largest of the three kernels (dK / dV) needs, estimated: its key
    and value tiles, `stages` buffered query and dO tiles (the loop's pipelined loads), and P and dS
    as operands of its products, block x block each."""
    return itemsize * (2 * block * head_dim + 2 * stages * block * head_dim + 2 * block * block)


def candidates(head_dim: int, dtype, limit: int) -> list[Launch]:
    """The launch configurations the search tries for `head_dim` in `dtype`, within `limit` bytes of
    shared memory (stage 1 for a tile where 2 stages do not fit)."""
    itemsize = jnp.dtype(dtype).itemsize
    out = []
    for block in BLOCKS:
        out += _fitting(block, head_dim, itemsize, limit)
    return out or _fitting(SMALLEST_BLOCK, head_dim, itemsize, limit)


def _fitting(block: int, head_dim: int, itemsize: int, limit: int) -> list[Launch]:
    stages = [s for s in STAGES if shared_memory_need(block, head_dim, itemsize, s) <= limit]
    if not stages and shared_memory_need(block, head_dim, itemsize, 1) <= limit:
        stages = [1]
    return [Launch(block=block, num_warps=warps, num_stages=s, interpret=False)
            for warps in WARPS if warps == 4 or block >= 64 for s in stages]


def refusal(head_dim: int, dtype, limit: int) -> str | None:
    """Why the compiled kernel cannot take `head_dim` in `dtype` with `limit` bytes of shared memory,
    or None."""
    why = pallas.head_dim_refusal(head_dim)
    if why is None and not candidates(head_dim, dtype, limit):
        need = shared_memory_need(SMALLEST_BLOCK, head_dim, jnp.dtype(dtype).itemsize, 1)
        why = (f"the Pallas kernel's smallest tile ({SMALLEST_BLOCK} rows) needs about {need // 1024} KB of shared "
               f"memory for heads of {head_dim} in {jnp.dtype(dtype).name}; this device has {limit // 1024} KB")
    return why


def measure(scheme: Scheme, dtype, launch: Launch, repeats: int = 5) -> float:
    """Median seconds of one forward and backward pass of the kernel with `launch` on SEARCH_SHAPE,
    compiled ahead of time (raises if it does not compile)."""
    b, t = SEARCH_SHAPE
    with jax.ensure_compile_time_eval():
        scheme = verify.concrete(scheme)
        x = jnp.asarray(np.random.default_rng(0).standard_normal(
            (b, t, scheme.dims.num_heads, scheme.dims.head_dim)), dtype)
    pos = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t))
    graphdef, params, rest = nnx.split(scheme, nnx.Param, ...)

    def loss(params, q, k, v):
        out = pallas_attention(q, k, v, pos, pos, nnx.merge(graphdef, params, rest), launch=launch)
        return out.astype(jnp.float32).sum()
    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(params, x, x, x).compile()
    jax.block_until_ready(step(params, x, x, x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(params, x, x, x))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def search(scheme: Scheme, dtype, launches: list[Launch], timer=None) -> Tuned:
    """Time every launch (`timer(scheme, dtype, launch)` -> seconds, default `measure`), then check
    them fastest first; the first that passes is chosen. None passing: the fastest, with its
    failing verdict (used only where the check is off)."""
    timer = timer or measure
    seconds, timings, rejected = {}, {}, {}
    for launch in launches:
        try:
            seconds[launch] = timer(scheme, dtype, launch)
            timings[launch.label] = round(seconds[launch] * 1e3, 4)
        except Exception as e:  # noqa: BLE001 - a candidate that does not compile (shared memory, registers)
            timings[launch.label] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    failed = None
    for launch in sorted(seconds, key=seconds.get):
        verdict = verify.verified("pallas", scheme, dtype, launch)
        if verdict.ok:
            return Tuned(launch, verdict, timings, rejected)
        rejected[launch.label] = verdict.reason
        failed = failed or (launch, verdict)
    if failed:
        return Tuned(failed[0], failed[1], timings, rejected)
    subject = verify.describe("pallas", scheme, dtype, None)
    return Tuned(None, Verdict(False, "error", f"{subject}: no launch configuration compiles ({timings})",
                               subject=subject), timings)


_TUNED: dict[str, Tuned] = {}


def tuned(scheme: Scheme, dtype) -> Tuned:
    """The search's outcome for this device, scheme, head dimension and dtype, once per machine."""
    key = verify.cache_key("search", scheme, dtype, None)
    if key not in _TUNED:
        saved = verify.read_cached(key)
        if saved is not None:
            launch = Launch(**saved["launch"])
            _TUNED[key] = Tuned(launch, verify.verified("pallas", scheme, dtype, launch), saved["timings"],
                                saved["rejected"])
        else:
            result = search(scheme, dtype, candidates(scheme.dims.head_dim, dtype, shared_memory_limit()))
            _TUNED[key] = result
            if result.verdict.status in ("passed", "mismatch"):
                verify.write_cached(key, {"launch": dataclasses.asdict(result.launch), "timings": result.timings,
                                          "rejected": result.rejected})
    return _TUNED[key]


def kernel_verdict(scheme: Scheme, dtype, dropout: bool = False) -> Verdict:
    """Whether the compiled kernel may run `scheme` here: refused for a shape it cannot take, else
    the check's verdict on the launch the search chose (with `dropout`, the check of its attention
    dropout too); a search that fails is an "error" verdict (XLA's paths are used), not an exception."""
    why = refusal(scheme.dims.head_dim, dtype, shared_memory_limit())
    if why:
        return Verdict.refused(why)
    try:
        result = tuned(scheme, dtype)
    except Exception as e:  # noqa: BLE001 - a search that fails is no kernel, never the end of the run
        subject = verify.describe("pallas", scheme, dtype, None)
        return Verdict(False, "error", f"the launch search for {subject} failed: {verify.first_line(e)}",
                       subject=subject)
    if dropout and result.verdict.ok:
        return verify.verified("pallas+dropout", scheme, dtype, result.launch)
    return result.verdict


def device_launch(scheme: Scheme, dtype) -> Launch:
    """The launch `pallas_attention` uses by default: on GPU the search's choice (the default
    configuration where there is none: then it fails to compile, or is refused, with its reason),
    elsewhere Pallas' interpreter."""
    if pallas.interpreted():
        return Launch()
    if refusal(scheme.dims.head_dim, dtype, shared_memory_limit()):
        return Launch(interpret=False)
    return tuned(scheme, dtype).launch or Launch(interpret=False)
