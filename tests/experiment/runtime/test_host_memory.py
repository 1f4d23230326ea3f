"""experiment.host_memory: freed host memory stays mapped, so large buffers are not re-faulted."""
import importlib.metadata
import importlib.util
import os
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from experiment.runtime import host_memory
from tests.conftest import REPO

# In a fresh process (malloc options are process-wide): a worker thread (as XLA's CPU runtime
# allocates from its worker threads) mallocs, fills and frees a 96 MB buffer five times; print the
# minor page faults of the last four rounds.
CHILD = textwrap.dedent("""
    import ctypes, resource, threading
    from experiment.runtime.host_memory import keep_freed_host_memory
    print(keep_freed_host_memory())
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    size, ptr = ctypes.c_size_t(96 << 20), ctypes.c_void_p()
    def one_round():
        ptr.value = libc.malloc(size)
        ctypes.memset(ptr, 1, size.value)
        libc.free(ptr)
    def rounds(out):
        one_round()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            one_round()
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    out = []
    worker = threading.Thread(target=rounds, args=(out,))
    worker.start(); worker.join()
    print(out[0])
""")


def _child(env_extra: dict) -> tuple[str, int]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **env_extra}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=REPO,
                          check=True, timeout=120)
    applied, faults = proc.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc options")
def test_freed_buffers_stay_mapped_for_worker_threads_and_the_switch_turns_it_off():
    applied, faults = _child({"LX_SYSTEM_MALLOC": "0"})
    if applied != "True":
        pytest.skip("not glibc: malloc options left alone")
    one_round = 96 * 2 ** 20 // os.sysconf("SC_PAGE_SIZE")
    # kept: the later rounds reuse the pages the first one mapped
    assert faults < one_round // 10
    applied, faults = _child({"LX_SYSTEM_MALLOC": "1"})
    assert applied == "False"
    # glibc's default: each round maps the buffer afresh and faults every page in again
    assert faults >= 3 * one_round


def test_switch_off_returns_false(monkeypatch):
    monkeypatch.setenv("LX_SYSTEM_MALLOC", "1")
    assert host_memory.keep_freed_host_memory() is False


def test_only_for_the_cpu_backend(monkeypatch):
    monkeypatch.delenv("LX_SYSTEM_MALLOC", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert host_memory.keep_freed_host_memory() is False


@pytest.mark.parametrize("platforms,cpu", [("cpu", True), ("cpu,cuda", True), (" CPU ", True), ("cuda", False),
                                           ("gpu", False), ("cuda,cpu", False), ("rocm", False), ("tpu", False)])
def test_jax_platforms_decides(monkeypatch, platforms, cpu):
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda: not cpu)  # not consulted
    assert host_memory.cpu_backend_expected() is cpu


@pytest.mark.parametrize("platforms", [None, ""])
@pytest.mark.parametrize("plugin", [True, False])
def test_without_jax_platforms_an_installed_plugin_decides(monkeypatch, platforms, plugin):
    if platforms is None:
        monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    else:
        monkeypatch.setenv("JAX_PLATFORMS", platforms)
    monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda: plugin)
    assert host_memory.cpu_backend_expected() is (not plugin)


def _no_plugins(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    monkeypatch.setattr(pkgutil, "iter_modules", lambda path=None, prefix="": iter(()))


def test_no_plugin_found(monkeypatch):
    _no_plugins(monkeypatch)
    assert host_memory.accelerator_plugin_installed() is False


def test_plugin_advertised_by_entry_point(monkeypatch):
    _no_plugins(monkeypatch)
    entry = importlib.metadata.EntryPoint("xla_cuda12", "jax_plugins.xla_cuda12", "jax_plugins")
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [entry] if group == "jax_plugins" else [])
    assert host_memory.accelerator_plugin_installed() is True


@pytest.mark.parametrize("module", ["jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu", "jax_plugins"])
def test_plugin_module_found(monkeypatch, module):
    _no_plugins(monkeypatch)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: object() if name == module else None)
    assert host_memory.accelerator_plugin_installed() is True


@pytest.mark.parametrize("module,found", [("jax_rocm7_plugin", True), ("jax_rocm60_plugin", True),
                                          ("jax_rocm_tools", False)])
def test_rocm_plugin_module_found(monkeypatch, module, found):
    _no_plugins(monkeypatch)
    monkeypatch.setattr(pkgutil, "iter_modules",
                        lambda path=None, prefix="": iter([pkgutil.ModuleInfo(None, module, True)]))
    assert host_memory.accelerator_plugin_installed() is found


def test_decided_without_importing_jax():
    """Before JAX starts its threads: the decision imports neither JAX nor a plugin."""
    child = textwrap.dedent("""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("host_memory", "experiment/runtime/host_memory.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.cpu_backend_expected(), module.accelerator_plugin_installed()
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "jax_plugins", "libtpu")
                     or "plugin" in m))
    """)
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, cwd=REPO,
                          check=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout
