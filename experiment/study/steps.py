"""Run a TrainingStudy's steps (experiment/study/__init__.py): each project command in a process of its
own from the repository root, in order, its output shown as it comes; a step whose `done_if` path
exists is skipped, a copy step copies files from the run folder to the result folder, and a command
that fails stops the study with its exit status and the command (run the study again to resume).
"""
from __future__ import annotations

import glob
import importlib.util
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Callable

from experiment.runtime import interrupts
from experiment.study import ENTRY_POINTS, Step, TrainingStudy

REPO = pathlib.Path(__file__).resolve().parents[2]


class StepFailed(ValueError):
    """A step's command exited with an error; the message names the step and its command."""


def check(study: TrainingStudy) -> None:
    """Every step's entry point exists (a script at the root, a module of the project) and every
    --config file it names is there; nothing runs."""
    for step in (*study.steps, *study.check):
        if step.copy:
            continue
        entry = step.argv[0] if step.argv else ""
        if entry not in ENTRY_POINTS:
            raise ValueError(f"study {study.name}: step {step.command()!r} does not start with an entry point "
                             f"({', '.join(ENTRY_POINTS)})")
        if entry == "-m" and (len(step.argv) < 2 or importlib.util.find_spec(step.argv[1]) is None):
            raise ValueError(f"study {study.name}: step {step.command()!r}: no such module")
        for flag, value in zip(step.argv, step.argv[1:]):
            if flag == "--config" and "{" not in value.split(":")[0] and not (REPO / value.split(":")[0]).is_file():
                raise ValueError(f"study {study.name}: step {step.command()!r}: no config {value.split(':')[0]}")


def run_steps(name: str, steps: tuple[Step, ...], workdir: pathlib.Path, out: pathlib.Path,
              say: Callable[[str], None] = print) -> None:
    """Each step in order (see the module's docstring); the folders as paths from the repository root
    where they lie below it (the commands run there, and the reports name their runs so)."""
    w, o = _from_root(workdir), _from_root(out)
    for i, step in enumerate(steps, 1):
        head = f"step {i} of {len(steps)}: {step.command(w, o)}"
        if step.done_if and (REPO / step.done_if.replace("{W}", w)).exists():
            say(f"{head}: done already ({step.done_if.replace('{W}', w)} exists)")
            continue
        say(head)
        start = time.perf_counter()
        if step.copy:
            _copy(step.copy[0].replace("{W}", w), pathlib.Path(step.copy[1].replace("{OUT}", o)))
        else:
            done = subprocess.run([sys.executable, *step.filled(w, o)], cwd=REPO)
            interrupts.check(f"interrupted in step {i} of {len(steps)} (its command says what it kept); run the "
                             f"study again to go on from there")
            if done.returncode != 0:
                raise StepFailed(f"study {name}: step {i} of {len(steps)} exited with status {done.returncode}: "
                                 f"{step.command(w, o)} (the study resumes from it when run again)")
        say(f"step {i} of {len(steps)} done in {time.perf_counter() - start:.0f} s")


def _from_root(path: pathlib.Path) -> str:
    absolute = pathlib.Path(path).resolve()
    try:
        return str(absolute.relative_to(REPO))
    except ValueError:
        return str(absolute)


def _copy(pattern: str, folder: pathlib.Path) -> None:
    found = sorted(glob.glob(pattern, root_dir=REPO))
    if not found:
        raise StepFailed(f"cp {pattern}: no such file (the step before it should have written it)")
    (REPO / folder).mkdir(parents=True, exist_ok=True)
    for path in found:
        if (REPO / path).is_file():
            shutil.copyfile(REPO / path, REPO / folder / pathlib.Path(path).name)
