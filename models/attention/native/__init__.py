"""Kernels for the CPU in C++, compiled on this machine the first time a process needs them, and
registered with XLA as FFI targets (flash_attention.cc: models/attention/cpu_flash.py's path).

The source is compiled with the machine's C++ compiler (`$CXX`, else c++, g++ or clang++) for this
CPU's instruction set (-march=native, so AVX-512 where there is one, else AVX2, ...) against the FFI
headers of the installed jaxlib, into `~/.cache/lengthx/cpu_kernels/` (`$XDG_CACHE_HOME`;
`LX_KERNEL_CACHE=DIR` picks another folder). The library's name holds a hash of the source, the
compiler's version, its flags, jax's version and the CPU (its model and feature flags), so a second
process loads it without compiling (~3 s), a machine of another CPU sharing the home folder builds
its own, and an edit to the source builds again. Concurrent builds (test workers) write to a
temporary file and rename it into place.

Where no compiler works, or `LX_CPU_KERNELS=0`, `unavailable()` says why in one line and the
attention paths run without these kernels (choice.py's `auto` keeps XLA's; an explicit
`model.attention=cpu_flash` is refused with that reason).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile

import jax

SOURCE = pathlib.Path(__file__).with_name("flash_attention.cc")
TARGET = "lx_flash_attention"  # the FFI target's name (and the handler's symbol)
# tried in order: the first that compiles is kept (-march=native is GCC's and Clang's on x86; Apple's
# Clang on ARM takes -mcpu=native; the last, plain, leaves the vector width to the compiler's default)
ARCH_FLAGS = (("-march=native",), ("-mcpu=native",), ())
BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-w")


class KernelUnavailable(RuntimeError):
    """No CPU kernel library on this machine; the message says why in one line."""


def _compilers() -> list[str]:
    named = os.environ.get("CXX")
    found = [named] if named else []
    return found + [c for c in ("c++", "g++", "clang++") if shutil.which(c) and c not in found]


def _cpu_identity() -> str:
    """The CPU's model and feature flags (what -march=native compiles for)."""
    try:
        lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
        keep = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
        return "\n".join(sorted(set(keep))) or platform.processor()
    except OSError:
        return platform.machine() + platform.processor()


def cache_folder() -> pathlib.Path:
    chosen = os.environ.get("LX_KERNEL_CACHE")
    if chosen:
        return pathlib.Path(chosen)
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "lengthx" / "cpu_kernels"


def _version(compiler: str) -> str:
    done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    return done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout else ""


def _build() -> pathlib.Path:
    """The compiled library for this machine: from the cache, else compiled now (KernelUnavailable where
    no compiler does it)."""
    include = jax.ffi.include_dir()
    source = SOURCE.read_bytes()
    folder = cache_folder()
    errors = []
    for compiler in _compilers():
        version = _version(compiler)
        if not version:
            errors.append(f"{compiler}: does not run")
            continue
        for arch in ARCH_FLAGS:
            flags = (*BASE_FLAGS, *arch)
            key = hashlib.sha1(b"\0".join([source, version.encode(), " ".join(flags).encode(),
                                           jax.__version__.encode(), _cpu_identity().encode()])).hexdigest()[:16]
            library = folder / f"flash_attention-{key}.so"
            if library.exists():
                return library
            folder.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(dir=folder, suffix=".so.partial")
            os.close(handle)
            done = subprocess.run([compiler, *flags, f"-I{include}", str(SOURCE), "-o", partial],
                                  capture_output=True, text=True, timeout=600)
            if done.returncode == 0:
                os.replace(partial, library)  # atomic: a concurrent build of the same key writes the same bytes
                return library
            os.unlink(partial)
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            errors.append(f"{compiler} {' '.join(arch) or '(no -march)'}: {last[:200]}")
    if not errors:
        raise KernelUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")
    raise KernelUnavailable("the C++ compiler failed: " + "; ".join(errors))


@functools.cache
def _loaded() -> tuple[ctypes.CDLL | None, pathlib.Path | None, str | None]:
    """(the library, its file, None), or (None, None, why not): built or found, loaded and its FFI target
    registered with XLA for the CPU, once per process."""
    if os.environ.get("LX_CPU_KERNELS", "1") == "0":
        return None, None, "LX_CPU_KERNELS=0 switches the compiled CPU kernels off"
    try:
        path = _build()
        lib = ctypes.cdll.LoadLibrary(str(path))
    except KernelUnavailable as e:
        return None, None, str(e)
    except (OSError, subprocess.SubprocessError) as e:
        return None, None, f"the CPU kernels could not be built or loaded: {e}"
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(getattr(lib, TARGET)), platform="cpu")
    return lib, path, None


def library() -> ctypes.CDLL:
    """The loaded kernel library (KernelUnavailable where it cannot be had)."""
    lib, _, why = _loaded()
    if lib is None:
        raise KernelUnavailable(why)
    return lib


def build_key() -> str:
    """The hash naming this machine's build (its source, compiler, flags, jax and CPU)."""
    library()
    return _loaded()[1].stem.rsplit("-", 1)[-1]


def unavailable() -> str | None:
    """Why the kernels cannot be used in this process (None: they can), in one line."""
    return _loaded()[2]


def panel_width() -> int:
    """Keys per panel of the packed K (the QK kernel's width in this build)."""
    return int(library().lx_flash_panel_width())


def vector_width() -> int:
    """Floats per vector register in this build (V's feature count is padded to a multiple)."""
    return int(library().lx_flash_vector_width())
