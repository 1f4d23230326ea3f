"""The Pallas kernel's launch configuration per device, chosen by a small search the first time a
(device kind, scheme with its options, head dimension, dtype) is met, and cached.

A fixed tile of 64 rows with 4 warps and 2 pipelining stages fits some GPUs and head dimensions
and not others: a tile's operands live in the multiprocessor's shared memory (99 KB on consumer
GPUs, 163 KB on an A100, 227 KB on an H100), and what runs fastest differs by device. Candidates:
tiles of 32, 64 or 128 rows (queries and keys alike; 16 where none of those fits; and 128 query rows
with 64-key tiles, flash attention 2's usual shape), 4 or 8 warps (8
for tiles of 64 rows or more), 2 or 3 stages (1 where 2 does not fit), kept where the kernels'
shared memory (`shared_memory_need`, an estimate) fits the device's (`shared_memory_limit`); where
the backward kernels fit only 1 stage, the forward kernel, which holds no dO tiles and one block x
block tile, keeps 2 if they fit it (`forward_shared_memory_need`: 128-row tiles at head size 128
on an H100). Each is compiled and timed on a forward and
backward pass (`SEARCH_SHAPE`); one that fails to compile is dropped with its error; from the
fastest down, the first that passes the numerical check (verify.py) is chosen (each timed as
repeats inside one compiled loop, `loop_seconds`, so that dispatch does not decide). Head dimensions the
kernel cannot take, or for which no candidate fits, are refused with the reason (`refusal`).

The result is cached like the check's verdicts (in memory and in JAX's compilation cache folder,
verify.cache_folder), so the search (a few seconds per candidate on a GPU) runs once per machine.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.attention import pallas, verify
from models.attention.pallas import Launch
from models.attention.paths import PATHS, Call
from models.attention.verify import Verdict
from posenc import Scheme

BLOCKS, WARPS, STAGES = (32, 64, 128), (4, 8), (2, 3)
SMALLEST_BLOCK = 16  # where no tile of BLOCKS fits (wide heads in float32): Triton's smallest product
# Shared memory a block may use (opt-in maximum), KB, by CUDA compute capability
SHARED_MEMORY_KB = {(7, 0): 96, (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99, (9, 0): 227,
                    (10, 0): 227, (10, 3): 227, (12, 0): 99}
DEFAULT_SHARED_MEMORY_KB = 99  # a device not in the table: the smallest of current GPUs
SEARCH_SHAPE = (2, 1024)  # sequences and tokens of the timed forward and backward pass
LOOP_SECONDS = 0.05  # each timing repeats the pass inside one compiled loop for at least this long


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


def shared_memory_need(block: int, head_dim: int, itemsize: int, stages: int, keys: int | None = None) -> int:
    """Bytes of shared memory the largest of the three kernels (dK / dV) needs, estimated: its key
    and value tiles (`keys` rows, default `block`), `stages` buffered query and dO tiles (the loop's
    pipelined loads, `block` rows), and P and dS as operands of its products, block x keys each."""
    keys = keys or block
    return itemsize * (2 * keys * head_dim + 2 * stages * block * head_dim + 2 * block * keys)


def forward_shared_memory_need(block: int, head_dim: int, itemsize: int, stages: int, keys: int | None = None) -> int:
    """Bytes of shared memory the forward kernel needs, estimated: its query tile, `stages` buffered
    key and value tiles (`keys` rows, default `block`), and P as an operand of its product."""
    keys = keys or block
    return itemsize * (block * head_dim + 2 * stages * keys * head_dim + block * keys)


def candidates(head_dim: int, dtype, limit: int) -> list[Launch]:
    """The launch configurations the search tries for `head_dim` in `dtype`, within `limit` bytes of
    shared memory (stage 1 for a tile where 2 stages do not fit)."""
    itemsize = jnp.dtype(dtype).itemsize
    out = []
    for block in BLOCKS:
        out += _fitting(block, head_dim, itemsize, limit)
    out += _fitting(BLOCKS[-1], head_dim, itemsize, limit, keys=BLOCKS[-1] // 2)
    return out or _fitting(SMALLEST_BLOCK, head_dim, itemsize, limit)


def _fitting(block: int, head_dim: int, itemsize: int, limit: int, keys: int | None = None) -> list[Launch]:
    stages = [s for s in STAGES if shared_memory_need(block, head_dim, itemsize, s, keys) <= limit]
    forward = None
    if not stages and shared_memory_need(block, head_dim, itemsize, 1, keys) <= limit:
        stages = [1]
        forward = 2 if forward_shared_memory_need(block, head_dim, itemsize, 2, keys) <= limit else None
    return [Launch(block=block, num_warps=warps, num_stages=s, interpret=False, forward_stages=forward, key_block=keys)
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


def loop_seconds(step, args, min_seconds: float = LOOP_SECONDS, max_repeats: int = 1000) -> float:
    """Seconds per call of `step(*args)` (a pytree of arrays out), timed as repeats inside one compiled
    loop (no dispatch between them), enough of them to last `min_seconds`. Each repeat's inputs are
    moved by the loop's carry (by ~1e-30: the same values) and every output is summed into it, so
    that XLA can neither hoist the call out of the loop nor drop any of its work."""
    def many(n, args):
        def body(i, carry):
            moved = jax.tree.map(lambda x: x + (carry * 1e-30).astype(x.dtype)
                                 if jnp.issubdtype(x.dtype, jnp.floating) else x, args)
            return carry + sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(step(*moved)))
        return jax.lax.fori_loop(0, n, body, jnp.float32(0))
    compiled = jax.jit(many).lower(np.int32(1), args).compile()
    jax.block_until_ready(compiled(np.int32(1), args))
    start = time.perf_counter()
    jax.block_until_ready(compiled(np.int32(1), args))
    once = max(time.perf_counter() - start, 1e-7)
    repeats = int(min(max_repeats, max(1, -(-min_seconds // once))))
    start = time.perf_counter()
    jax.block_until_ready(compiled(np.int32(repeats), args))
    return (time.perf_counter() - start) / repeats


def pass_seconds(path: str, scheme: Scheme, dtype, shape: tuple[int, int], launch: Launch | None = None,
                 block: int | None = None) -> float:
    """Seconds of one forward and backward pass (gradients of q, k, v and the scheme's parameters) of
    attention path `path` of PATHS for `scheme` on `shape` (rows, tokens) in `dtype`, `loop_seconds`
    (raises if it does not compile)."""
    rows, length = shape
    with jax.ensure_compile_time_eval():
        scheme = verify.concrete(scheme)
        x = jnp.asarray(np.random.default_rng(0).standard_normal(
            (rows, length, scheme.dims.num_heads, scheme.dims.head_dim)), dtype)
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))  # concrete, even inside a trace
    graphdef, params, rest = nnx.split(scheme, nnx.Param, ...)
    row = PATHS[path]
    call = dict(launch=launch, **({"block": block} if block else {}))

    def loss(params, q, k, v):
        out = row.run(q, k, v, Call(pos, pos, nnx.merge(graphdef, params, rest), **call))
        return out.astype(jnp.float32).sum()
    return loop_seconds(jax.grad(loss, argnums=(0, 1, 2, 3)), (params, x, x, x))


def measure(scheme: Scheme, dtype, launch: Launch) -> float:
    """Seconds of one forward and backward pass of the kernel with `launch` on SEARCH_SHAPE
    (`pass_seconds`: repeats in one compiled loop; raises if it does not compile)."""
    return pass_seconds("pallas", scheme, dtype, SEARCH_SHAPE, launch)


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


# ---- the kernel against XLA's paths, at the shape that runs ------------------------------------------

_RACES: dict[str, dict] = {}


def race_shape(rows: int, length: int, tokens: int = 65536) -> tuple[int, int]:
    """The (rows, tokens) a race times for calls of `rows` x `length`: the length as it is, the rows
    cut so that at most `tokens` tokens run (both paths scale alike with rows), at least one."""
    return max(1, min(rows, tokens // max(length, 1))), length


def race(scheme: Scheme, dtype, rows: int, length: int, rival: str, block: int | None = None) -> dict:
    """{"kernel_ms", "rival_ms", "shape"}: one forward and backward pass of the kernel (with the
    launch the device search chose) and of XLA's path `rival` (what `auto` runs without the kernel)
    at `race_shape(rows, length)`, once per key (device, scheme, dtype, sources, shape, rival) in this
    process and on this machine, like the check's verdicts. A rival that does not run: the kernel wins."""
    shape = race_shape(rows, length)
    launch = device_launch(scheme, dtype)
    key = f"{verify.cache_key('race', scheme, dtype, launch)}-{rival}-r{shape[0]}-L{shape[1]}"
    if key not in _RACES:
        saved = verify.read_cached(key)
        if saved is None:
            kernel = pass_seconds("pallas", scheme, dtype, shape, launch)
            try:
                other = pass_seconds(rival, scheme, dtype, shape, block=block)
            except Exception:  # noqa: BLE001 - e.g. out of memory at this length: the kernel runs
                other = float("inf")
            saved = {"kernel_ms": kernel * 1e3, "rival_ms": other * 1e3, "shape": list(shape), "rival": rival}
            verify.write_cached(key, saved)
        _RACES[key] = saved
    return _RACES[key]

