"""Keep freed host memory mapped, so that every XLA CPU step stops re-faulting its temporaries.

XLA's CPU runtime allocates an executable's temporaries (290 MB for a training step of the benchmark
model) with posix_memalign, from its worker threads. glibc serves a worker thread from a thread
arena, whose heaps hold at most 64 MB, so a larger request is mapped afresh with mmap and unmapped
when freed: every step the kernel zero-fills all of it again. On 2 CPU cores that was 77,000 page
faults and 178 ms of system CPU time per 521 ms training step; with one arena that may not mmap and
keeps up to `trim_threshold` bytes of freed memory, 15,000, 34 ms and 442 ms
(python -m benchmarks.host_memory).

This sets glibc's process-wide malloc options, so the entry points call it first, before JAX starts
its threads. It changes speed only, never results. LX_SYSTEM_MALLOC=1 leaves malloc as it is.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameter numbers


def keep_freed_host_memory(trim_threshold: int = 1 << 30) -> bool:
    """One malloc arena, no mmap'd chunks, and freed memory kept up to `trim_threshold` bytes.
    Returns whether the options were set (False off glibc, or with LX_SYSTEM_MALLOC=1)."""
    if os.environ.get("LX_SYSTEM_MALLOC") == "1" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):  # musl and others: leave alone
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)))
    return all(mallopt(param, value) == 1 for param, value in settings)
