"""What every entry point does before its work."""
from __future__ import annotations

import logging

from experiment.runtime import accelerator, distributed
from experiment.runtime.host_memory import keep_freed_host_memory


def start_runtime(coordinator_address: str | None = None, num_processes: int | None = None,
                  process_id: int | None = None) -> None:
    """Malloc settings on CPU, the compilation cache, the multi-process runtime (when launched as
    several processes), logging (warnings only on the processes that do not write)."""
    keep_freed_host_memory()  # before JAX starts its threads (experiment/runtime/host_memory.py)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    for noisy in ("absl", "orbax", "jax", "datasets", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    accelerator.enable_compilation_cache()
    distributed.initialize(coordinator_address, num_processes, process_id)
    if not distributed.is_writer():
        logging.getLogger().setLevel(logging.WARNING)
