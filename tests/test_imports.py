"""The shape of the house, read from the source: no import circle anywhere in the project (imports
inside functions count too), reports read records without scoring code, evaluation without training."""
from __future__ import annotations

import ast
import pathlib

from tests.conftest import REPO

PACKAGES = ("configs", "corpora", "experiment", "models", "posenc", "benchmarks")
ENTRY_POINTS = ("train", "eval_extrapolate", "report", "sweep", "import_hf", "export_hf", "selfcheck")
SCORING = ("experiment.evals", "experiment.train", "experiment.pipeline")
ACCELERATOR_LIBRARIES = ("jax", "flax", "orbax", "optax")


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


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_no_import_circle_anywhere():
    graph, _ = import_graph()
    circles = sorted(name for name in graph if name in reachable(graph, name))
    assert not circles, f"modules on an import circle: {circles}"


def test_the_circle_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert sorted(n for n in graph if n in reachable(graph, n)) == ["a", "b", "c"]


def test_reports_import_no_accelerator_library_and_no_scoring_code():
    graph, outside = import_graph()
    reports = [name for name in graph if name.startswith("experiment.report")]
    assert len(reports) >= 6
    for name in reports:
        assert not outside[name] & set(ACCELERATOR_LIBRARIES), (name, outside[name])
        assert not any(t.startswith(("models",) + SCORING) for t in graph[name]), (name, graph[name])
        assert not any(t.startswith(SCORING) for t in reachable(graph, name)), name


def test_evaluation_does_not_import_training():
    graph, _ = import_graph()
    evals = [name for name in graph if name.startswith("experiment.evals")]
    assert len(evals) >= 4
    for name in evals:
        assert not any(t.startswith(("experiment.train", "experiment.pipeline")) for t in reachable(graph, name)), name
