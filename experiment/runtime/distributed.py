"""Several processes (hosts) as one JAX job, and which of them writes the run folder's files.

`initialize()` starts JAX's multi-process runtime when the job was launched as several processes:
- on a TPU pod slice and under SLURM (`srun`, more than one task) or Open MPI, JAX finds the
  coordinator, the process count and this process's id itself;
- anywhere else, pass them: `--coordinator_address=HOST:PORT --num_processes=N --process_id=I`
  (or the variables JAX_COORDINATOR_ADDRESS, LX_NUM_PROCESSES, LX_PROCESS_ID).
A single process (the usual case) starts nothing. Every process then runs the same program; each
reads only its rows of every batch, and only `is_writer()` (process 0, experiment/store/run.py)
writes config.json, the tokenizer, metrics, results and reports.
"""
from __future__ import annotations

import logging
import os

import jax
import numpy as np

from experiment.store.run import is_writer  # noqa: F401 (the run folder's question, answered there without JAX)

log = logging.getLogger(__name__)


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def launched_as_several_processes() -> bool:
    """Whether the environment says this process is one of several of one job."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    for count in ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):
        if (_int_env(count) or 1) > 1:
            return True
    return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
    """Start the multi-process runtime if this is one process of several; returns whether it did.
    Idempotent. On the CPU backend the processes talk through gloo (JAX's CPU collectives)."""
    if jax.distributed.is_initialized():
        return True
    num_processes = num_processes if num_processes is not None else _int_env("LX_NUM_PROCESSES")
    process_id = process_id if process_id is not None else _int_env("LX_PROCESS_ID")
    if num_processes == 1:
        return False
    if coordinator_address is None and num_processes is None and not launched_as_several_processes():
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
    log.info("process %d of %d; %d devices in all, %d here", jax.process_index(), jax.process_count(),
             jax.device_count(), jax.local_device_count())
    return True


def barrier(name: str) -> None:
    """Wait until every process reaches `name` (a no-op in a single process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
    """Whether `flag` is true in any process of the job (a collective: every process calls it at the
    same point; in a single process, `flag` itself)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils
    return bool(np.asarray(multihost_utils.process_allgather(np.asarray(flag, dtype=np.int32))).any())
