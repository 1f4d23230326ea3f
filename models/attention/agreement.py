"""One decision for every process of a job: what the device check, the launch search and the race decide
(verdicts.py, tuning.py) is decided by process 0 and broadcast, so that every process traces the same
program. Without it each host ran its own check, search and race, and hosts whose timings or verdicts
came out otherwise traced different programs: a job that diverges or hangs in its first collective.

`agreed(decide)` runs `decide()` on process 0 only (the others wait for its answer) and returns its
JSON-able result on every process. The broadcast is a compiled program called at once (as the check
runs its kernels), so it also works while a model is being traced. In one process it is `decide()`.
"""
from __future__ import annotations

import contextlib
import functools
import json
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MAX_BYTES = 1 << 16  # a decision's JSON text: verdicts and launch choices are a few hundred bytes


@functools.lru_cache(maxsize=1)
def _summing_program():
    """(the input sharding, the compiled sum over every device's row): made once a process, so that a
    model's many attention calls share one compilation."""
    mesh = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1), ("process", "local"))
    sharding = NamedSharding(mesh, P(("process", "local")))
    shape = jax.ShapeDtypeStruct((jax.device_count(), MAX_BYTES + 4), jnp.int32, sharding=sharding)
    total = jax.jit(lambda x: jnp.sum(x, axis=0), out_shardings=NamedSharding(mesh, P()))
    return sharding, total.lower(shape).compile()


def _sum_over_processes(local: np.ndarray) -> np.ndarray:
    """The sum over processes of each process's `local` (uint8 of MAX_BYTES + 4), on every process."""
    sharding, total = _summing_program()
    rows = jax.local_device_count()
    per_device = np.broadcast_to(local.astype(np.int32), (rows, local.size)) * (np.arange(rows) == 0)[:, None]
    stacked = jax.make_array_from_process_local_data(sharding, np.ascontiguousarray(per_device))
    return np.asarray(total(stacked).addressable_data(0))


_DECIDING = {"now": False}  # process 0 inside a decision: a nested agreement is its own decision
_ALONE = {"now": 0}  # programs of one process's devices only: nothing to agree on


@contextlib.contextmanager
def each_process_alone():
    """Within it each process decides for itself and nothing is broadcast: for programs that run on one
    process's own devices (generation spread over processes, experiment/evals/spread.py, where the
    processes trace different numbers of programs, so a broadcast in each would not pair up)."""
    _ALONE["now"] += 1
    try:
        yield
    finally:
        _ALONE["now"] -= 1


def agreed(decide: Callable[[], Any]) -> Any:
    """`decide()` on process 0, its result (JSON: dicts, lists, strings, numbers) on every process."""
    if jax.process_count() == 1 or _DECIDING["now"] or _ALONE["now"]:
        return decide()
    text = b""
    if jax.process_index() == 0:
        _DECIDING["now"] = True
        try:
            text = json.dumps(decide()).encode()
        finally:
            _DECIDING["now"] = False
    if len(text) > MAX_BYTES:
        raise ValueError(f"a decision of {len(text)} bytes is more than the {MAX_BYTES} that agreement carries")
    local = np.zeros(MAX_BYTES + 4, np.uint8)
    local[:4] = np.frombuffer(np.uint32(len(text)).tobytes(), np.uint8)
    local[4:4 + len(text)] = np.frombuffer(text, np.uint8)
    got = _sum_over_processes(local).astype(np.uint8)
    size = int(np.frombuffer(got[:4].tobytes(), np.uint32)[0])
    return json.loads(got[4:4 + size].tobytes().decode())
