"""Keep freed host memory mapped, so that every XLA CPU step stops re-faulting its temporaries.

XLA's CPU runtime allocates an executable's temporaries (for a training step of the benchmark model,
far more than 64 MB) with posix_memalign, from its worker threads. glibc serves a worker thread from
a thread arena, whose heaps hold at most 64 MB, so a larger request is mapped afresh with mmap and
unmapped when freed: every step the kernel zero-fills all of it again, which costs page faults,
system CPU time and step time. One arena that may not mmap and keeps up to `trim_threshold` bytes of
freed memory removes most of that (python -m benchmarks.host_memory measures it; the numbers are in
benchmarks/README.md, "Measured numbers behind design choices").

This sets glibc's process-wide malloc options, so the entry points call it first, before JAX starts
its threads. It changes speed only, never results. It is for the CPU backend only: on a GPU machine
the same options kept XLA's GPU compiler in the kernel, compiling several times slower (same README
section), so it applies only where JAX is expected to run on the CPU, which is decided without
starting JAX (cpu_backend_expected). LX_SYSTEM_MALLOC=1 leaves malloc as it is.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameter numbers

# Top-level modules of JAX's accelerator backends (jax[cuda12], jax[cuda13], jax[tpu]; jax_plugins is
# the namespace the PJRT plugins live in), and the pattern of the ROCm ones (jax_rocm7_plugin, ...).
ACCELERATOR_MODULES = ("jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu", "jax_plugins")
ROCM_MODULE = re.compile(r"jax_rocm\d+_plugin")


def accelerator_plugin_installed() -> bool:
    """Whether a JAX accelerator backend is installed, found without importing it (or JAX)."""
    if any(True for _ in importlib.metadata.entry_points(group="jax_plugins")):
        return True
    if any(importlib.util.find_spec(name) is not None for name in ACCELERATOR_MODULES):
        return True
    return any(ROCM_MODULE.fullmatch(module.name) for module in pkgutil.iter_modules())


def cpu_backend_expected() -> bool:
    """Whether JAX will run on its CPU backend: the first of JAX_PLATFORMS where that is set, else
    CPU unless an accelerator plugin is installed (one with no device present falls back to the CPU,
    but is taken for an accelerator: JAX_PLATFORMS=cpu says so). Initializes no JAX backend."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip().lower() == "cpu"
    return not accelerator_plugin_installed()


def keep_freed_host_memory(trim_threshold: int = 1 << 30) -> bool:
    """One malloc arena, no mmap'd chunks, and freed memory kept up to `trim_threshold` bytes.
    Returns whether the options were set (False off glibc, with LX_SYSTEM_MALLOC=1, or where JAX is
    expected to run on an accelerator)."""
    if os.environ.get("LX_SYSTEM_MALLOC") == "1" or not sys.platform.startswith("linux"):
        return False
    if not cpu_backend_expected():
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
