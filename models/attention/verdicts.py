"""What the device check (verify.py), the launch search and the race (tuning.py) keep per machine:
in memory for the process, and on disk as one JSON file per key in `kernel_checks/` inside JAX's
compilation cache folder where one is set (the entry points set it: experiment/runtime/accelerator.py),
so that each costs once per machine.

A key names the device kind, the scheme with its options, heads, head dimension, dtype, launch
configuration, jax version, jaxlib / CUDA / cuDNN / driver versions (`runtime_versions`) and the
source of the kernels, their check and the scheme
(`source_digest`: an edit to any of them is checked again). A verdict that is a mismatch is kept on
disk too (it is deterministic); a failure to compile or run, of the kernel or of the check itself,
only in memory, so that the next process tries again; no failure inside the check ends the run
(`verified` returns it as a verdict: XLA's paths are used, and the reason is said in one line).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import os
import pathlib
import sys
import tempfile

import jax
import jax.numpy as jnp

from models.attention import verify
from models.attention.pallas import Launch
from models.attention.verify import Verdict
from posenc import Scheme

_VERDICTS: dict[str, Verdict] = {}


def cache_folder() -> pathlib.Path | None:
    """`kernel_checks/` in JAX's compilation cache folder, or None where none is set (or it is remote)."""
    folder = jax.config.jax_compilation_cache_dir
    if not folder or "://" in str(folder):
        return None
    return pathlib.Path(folder) / "kernel_checks"


CHECKED_SOURCES = ("models.attention.pallas", "models.attention.pallas_kernels", "models.attention.verify",
                   "models.attention.verdicts", "models.attention.tuning", "models.attention.launches",
                   "models.attention.paths", "models.attention.call", "models.attention.dense",
                   "models.attention.triangular", "models.attention.fused", "posenc.kernel_bias", "posenc.base")


@functools.cache
def _file_digest(file: str) -> str:
    return hashlib.sha1(pathlib.Path(file).read_bytes()).hexdigest()


def source_digest(scheme: Scheme) -> str:
    """A hash of the source of the kernels and their check (CHECKED_SOURCES) and of the module of
    every scheme in `scheme`'s chain (a wrapper's inner schemes too): an edit to any of them keys
    its verdicts anew."""
    modules = [importlib.import_module(name) for name in CHECKED_SOURCES]  # the same set in every process
    current = scheme
    while current is not None:
        modules.append(sys.modules[type(current).__module__])
        current = getattr(current, "inner", None)
    files = sorted({inspect.getsourcefile(m) or "" for m in modules} - {""})
    return hashlib.sha1("".join(_file_digest(f) for f in files).encode()).hexdigest()


def _launch_slug(launch: Launch) -> str:
    one = lambda x: (f"b{x.block}" + (f"x{x.keys}" if x.keys != x.block else "") + f"w{x.num_warps}s{x.num_stages}")
    return f"-{one(launch)}" + (f"-bwd{one(launch.backward)}" if launch.backward is not None else "")


@functools.cache
def runtime_versions() -> dict[str, str]:
    """What below JAX decides what a kernel compiles to and how it runs: jaxlib, the backend's platform
    version (on a GPU: the CUDA or ROCm runtime and the driver, as the plugin reports them) and, where
    the CUDA plugin says it, cuDNN's version. A verdict kept under one is checked again under another."""
    import jaxlib
    versions = {"jaxlib": jaxlib.__version__}
    try:
        versions["platform"] = str(jax.devices()[0].client.platform_version)
    except Exception:  # noqa: BLE001 - a backend that does not say: the other versions still key it
        pass
    try:
        from jax._src.lib import cuda_versions
        if cuda_versions is not None:
            versions["cudnn"] = str(cuda_versions.cudnn_get_version())
            versions["cuda_driver"] = str(cuda_versions.cuda_driver_get_version())
    except Exception:  # noqa: BLE001 - no CUDA plugin, or one without these calls
        pass
    return versions


def cache_key(kind: str, scheme: Scheme, dtype, launch: Launch | None, path: str = "pallas") -> str:
    """A file name for one (device kind, scheme with its options, heads, head dimension, dtype,
    launch configuration, jax version, `runtime_versions`, `source_digest`): readable, with a hash of
    what is not."""
    device = jax.devices()[0].device_kind
    exact = json.dumps([verify.posenc_block(scheme), dataclasses.asdict(launch) if launch else None, jax.__version__,
                        device, source_digest(scheme), runtime_versions()], sort_keys=True, default=str)
    config = "" if launch is None else _launch_slug(launch)
    interp = "-interpreted" if launch is not None and launch.interpret else ""
    slug = "".join(c if c.isalnum() else "_" for c in device.lower())
    return (f"{kind}-{path}-{slug}-{scheme.name}-h{scheme.dims.num_heads}-d{scheme.dims.head_dim}-"
            f"{jnp.dtype(dtype).name}{config}{interp}-{hashlib.sha1(exact.encode()).hexdigest()[:10]}")


def read_cached(key: str) -> dict | None:
    folder = cache_folder()
    file = folder / f"{key}.json" if folder else None
    if file is None or not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):  # a damaged file: check again
        return None


def write_cached(key: str, payload: dict) -> None:
    """One JSON file per key, written to a temporary name and renamed (processes may race)."""
    folder = cache_folder()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
        json.dump(payload, f, indent=1)
    os.replace(f.name, folder / f"{key}.json")


def launch_of(saved: dict | None) -> Launch | None:
    """A Launch from its saved form (dataclasses.asdict: the backward's as a dict too)."""
    if saved is None:
        return None
    backward = saved.get("backward")
    return Launch(**{**saved, "backward": Launch(**backward) if backward else None})


def verified(path: str, scheme: Scheme, dtype, launch: Launch | None = None) -> Verdict:
    """`verify.check`, once per key (see the module docstring) in this process and on this machine."""
    key = cache_key("check", scheme, dtype, launch, path)
    if key not in _VERDICTS:
        saved = read_cached(key)
        if saved is not None:
            _VERDICTS[key] = Verdict(**saved)
        else:
            try:
                verdict = verify.check(path, scheme, dtype, launch)
            except Exception as e:  # noqa: BLE001 - never end a run over its check: XLA's paths instead
                subject = verify.describe(path, scheme, dtype, launch)
                verdict = Verdict(False, "error", f"the check of {subject} failed: {verify.first_line(e)}",
                                  subject=subject)
            _VERDICTS[key] = verdict
            if verdict.status in ("passed", "mismatch"):
                write_cached(key, dataclasses.asdict(verdict))
    return _VERDICTS[key]
