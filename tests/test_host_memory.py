"""experiment.host_memory: freed host memory stays mapped, so large buffers are not re-faulted."""
import os
import subprocess
import sys
import textwrap

import pytest

from experiment import host_memory

# In a fresh process (malloc options are process-wide): a worker thread (as XLA's CPU runtime
# allocates from its worker threads) mallocs, fills and frees a 96 MB buffer five times; print the
# minor page faults of the last four rounds.
CHILD = textwrap.dedent("""
    import ctypes, resource, threading
    from experiment.host_memory import keep_freed_host_memory
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
    env = {**os.environ, **env_extra}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=root,
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
