"""The shape of the house, read from the source: no import circle anywhere in the project (imports
inside functions count too), reports read records without scoring code, evaluation without training,
and what a config file or a report reaches loads no accelerator library.

Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first, so what a module *reaches*
follows those package edges too (`reaching_graph`); the circle check reads the imports as written."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import REPO

PACKAGES = ("configs", "corpora", "experiment", "models", "posenc", "benchmarks")
ENTRY_POINTS = ("train", "eval_extrapolate", "report", "sweep", "import_hf", "export_hf", "selfcheck", "generate",
               "study")
SCORING = ("experiment.evals", "experiment.train", "experiment.pipeline")
ACCELERATOR_LIBRARIES = ("jax", "flax", "orbax", "optax")
# What a config file, the typed config, the reports and the training-free methods' table reach must load
# none of ACCELERATOR_LIBRARIES.
JAX_FREE = ("configs", "experiment.config", "experiment.report", "experiment.store", "experiment.evals.methods")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, pathlib.Path]:
    found = {name: REPO / f"{name}.py" for name in ENTRY_POINTS}
    for package in PACKAGES:
        found.update({module_name(p): p for p in (REPO / package).rglob("*.py")})
    return found


def imports_of(path: pathlib.Path, modules: dict) -> tuple[set[str], set[str]]:
    """(project modules, outside top-level packages) that the file imports, anywhere in it. `from A
    import B` counts as importing A.B where that is a module, else A."""
    inside, outside = set(), set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            (inside if target.split(".")[0] in PACKAGES + ENTRY_POINTS else outside).add(
                target if target.split(".")[0] in PACKAGES + ENTRY_POINTS else target.split(".")[0])
    return {t for t in inside if t in modules}, outside


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = project_modules()
    graph, outside = {}, {}
    for name, path in modules.items():
        graph[name], outside[name] = imports_of(path, modules)
    return graph, outside


def packages_of(name: str) -> list[str]:
    """The packages whose __init__ runs before `name` does: a.b.c -> [a, a.b]."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def reaching_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """`graph` with the package edges an import runs: a module importing a.b.c also runs a and a.b."""
    return {name: {p for t in targets for p in (*packages_of(t), t) if p in graph} for name, targets in graph.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def reached_by_importing(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every project module that `import name` runs: its packages, itself, and what they reach."""
    reaching = reaching_graph(graph)
    found = {name, *packages_of(name)}
    for start in list(found):
        found |= reachable(reaching, start)
    return {m for m in found if m in graph}


def test_no_import_circle_anywhere():
    graph, _ = import_graph()
    circles = sorted(name for name in graph if name in reachable(graph, name))
    assert not circles, f"modules on an import circle: {circles}"


def test_the_circle_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert sorted(n for n in graph if n in reachable(graph, n)) == ["a", "b", "c"]


def test_reachability_follows_package_init_edges():
    """Importing p.q.leaf runs p/__init__ and p/q/__init__, and whatever they import."""
    graph = {"p": {"heavy"}, "p.q": set(), "p.q.leaf": set(), "light": {"p.q.leaf"}, "heavy": set()}
    assert reached_by_importing(graph, "light") == {"light", "p", "p.q", "p.q.leaf", "heavy"}
    assert reached_by_importing(graph, "p.q.leaf") == {"p", "p.q", "p.q.leaf", "heavy"}


def test_reports_import_no_accelerator_library_and_no_scoring_code():
    graph, outside = import_graph()
    reports = [name for name in graph if name.startswith("experiment.report")]
    assert len(reports) >= 6
    for name in reports:
        assert not outside[name] & set(ACCELERATOR_LIBRARIES), (name, outside[name])
        assert not any(t.startswith(("models",) + SCORING) for t in graph[name]), (name, graph[name])
        assert not any(t.startswith(SCORING) for t in reached_by_importing(graph, name)), name


def test_evaluation_does_not_import_training():
    graph, _ = import_graph()
    evals = [name for name in graph if name.startswith("experiment.evals")]
    assert len(evals) >= 4
    for name in evals:
        reached = reached_by_importing(graph, name)
        assert not any(t.startswith(("experiment.train", "experiment.pipeline")) for t in reached), name


def test_configs_the_typed_config_the_store_and_reports_reach_no_accelerator_library():
    """Every module a config file, experiment.config, the run folder's store or a report reaches
    (package __init__ edges included) imports none of jax, flax, orbax, optax, anywhere in it."""
    graph, outside = import_graph()
    starts = [name for name in graph if name.startswith(JAX_FREE) and name != "experiment.store.checkpoints"]
    assert {"configs.demo", "experiment.config", "experiment.report.schemes", "experiment.evals.methods"} <= set(starts)
    offenders = {}
    for start in starts:
        for name in sorted(reached_by_importing(graph, start)):
            if outside[name] & set(ACCELERATOR_LIBRARIES):
                offenders.setdefault(name, set()).add(start)
    assert not offenders, "modules that import an accelerator library, and what reaches them:\n" + "\n".join(
        f"  {name} ({', '.join(sorted(outside[name] & set(ACCELERATOR_LIBRARIES)))}) <- "
        f"{', '.join(sorted(by)[:4])}{' ...' if len(by) > 4 else ''}" for name, by in sorted(offenders.items()))


@pytest.mark.parametrize("module", ["experiment.config", "configs.demo", "experiment.evals.methods"])
def test_importing_a_config_loads_no_jax(module):
    """What the import statements above cannot see (a library that imports JAX itself) shows here."""
    code = (f"import sys; import {module}; loaded = [m for m in sys.modules if m.split('.')[0] in "
            f"{ACCELERATOR_LIBRARIES}]; print(sorted({{m.split('.')[0] for m in loaded}}), len(loaded))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[] 0", f"import {module} loads modules of (libraries, count): {out.stdout.strip()}"
