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
from experiment.evals.kinds import evaluate_kinds
from experiment.store import files
from experiment.store.records import KINDS
from experiment.store.run import RunDir
from experiment.study import REQUIREMENTS, Cell, Study
from experiment.study.compare import compare_records

log = logging.getLogger(__name__)
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
        evaluate_kinds(workdir, cell.kinds, cell.request(chosen), say=say)
        say(f"cell {i} of {len(cells)} done in {time.perf_counter() - start:.0f} s")


def _imported(study: Study, workdir: pathlib.Path, say: Callable[[str], None]) -> pathlib.Path:
    if not (workdir / "config.json").exists():
        say(f"importing {study.model} into {workdir}")
        import_hf(study.model, workdir, data=dict(study.data) or None)
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
    from experiment.report import needles, ruler
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
    install_needs(study, say)
    _imported(study, workdir, say)
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
    install_needs(study, say)
    _imported(study, workdir, say)
    evaluate_cells(workdir, study.check, say)
    run = RunDir(workdir)
    text, same = compare_records(out / "records", {kind: run.records(kind) for kind in study.records},
                                 study.tolerance)
    say(text)
    return same
