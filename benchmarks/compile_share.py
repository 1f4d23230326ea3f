"""Where the test suite's time goes: a pytest plugin that adds up, per test, the seconds JAX reports for
tracing, lowering to MLIR and XLA's backend compile (with the number of programs compiled), beside the
test's own wall time, and prints the totals and the slowest tests at the end (docs/testing.md).

    python -m pytest -q -m 'not slow' -n 2 -p benchmarks.compile_share [--compile_share_json FILE]

With xdist each worker writes its tests to a folder that the controller reads back at the end.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import tempfile
import time

import pytest

EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}
_current: collections.Counter = collections.Counter()
_tests: dict[str, dict] = {}


def _listen(event: str, seconds: float, **_):
    if event in EVENTS:
        _current[EVENTS[event]] += seconds
        if event.endswith("backend_compile_duration"):
            _current["programs"] += 1


def pytest_addoption(parser):
    parser.addoption("--compile_share_json", default=None, help="write every test's figures to this file")


def pytest_configure(config):
    from jax._src import monitoring
    monitoring.register_event_duration_secs_listener(_listen)
    if not hasattr(config, "workerinput"):  # the controller (or the only process) owns the folder
        os.environ.setdefault("LX_COMPILE_SHARE_DIR", tempfile.mkdtemp(prefix="compile_share_"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _current.clear()
    start = time.perf_counter()
    yield
    _tests[item.nodeid] = {"wall": time.perf_counter() - start, **_current}


def summarize(tests: dict[str, dict], top: int = 15) -> str:
    """The totals over `tests` (nodeid -> wall, trace, lower, compile, programs) and the `top` slowest."""
    total = collections.Counter()
    for figures in tests.values():
        total.update(figures)
    wall = total["wall"] or 1.0
    lines = [f"compile share: {len(tests)} tests, {total['wall']:.0f} s in test calls; XLA backend compile "
             f"{total['compile']:.0f} s ({total['compile'] / wall:.0%}, {int(total['programs'])} programs), "
             f"lowering {total['lower']:.0f} s ({total['lower'] / wall:.0%}), tracing {total['trace']:.0f} s "
             f"({total['trace'] / wall:.0%}), the rest {wall - total['compile'] - total['lower'] - total['trace']:.0f} s"]
    for nodeid, f in sorted(tests.items(), key=lambda kv: -kv[1]["wall"])[:top]:
        lines.append(f"{f['wall']:7.1f} s  compile {f.get('compile', 0):6.1f} s in {int(f.get('programs', 0)):4d}"
                     f"  lower {f.get('lower', 0):5.1f}  trace {f.get('trace', 0):5.1f}  {nodeid}")
    return "\n".join(lines)


def pytest_sessionfinish(session):
    folder = pathlib.Path(os.environ["LX_COMPILE_SHARE_DIR"])
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    (folder / f"{worker}.json").write_text(json.dumps(_tests))


def pytest_terminal_summary(terminalreporter, config):
    folder = pathlib.Path(os.environ["LX_COMPILE_SHARE_DIR"])
    tests: dict[str, dict] = {}
    for path in sorted(folder.glob("*.json")):
        tests.update(json.loads(path.read_text()))
    if config.getoption("compile_share_json"):
        pathlib.Path(config.getoption("compile_share_json")).write_text(json.dumps(tests, indent=1))
    terminalreporter.write_line(summarize(tests))


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop("LX_COMPILE_SHARE_DIR", ""), ignore_errors=True)
