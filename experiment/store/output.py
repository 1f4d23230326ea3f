"""Folders that commands write outside a run (export_hf.py --out, report.py --out, a sweep's
report/): a command writes only into a folder it owns, and the folder then holds exactly what that
one call wrote.

- `claim(out, command)`: `out` is new, empty, or was written by `command` before (it holds MARKER,
  a one-line file naming the command; a report folder written before markers existed is recognised
  by its file names alone). A run folder, a folder another command wrote, or one holding anyone
  else's files is refused with one line that names the folder and a free one to use instead.
- `replacing(out, command)`: the whole output is written into a hidden sibling folder, which is
  swapped in at the end: an earlier call's files never sit beside the new ones, and a failed or
  interrupted call leaves `out` as it was. A second writer of `out` at the same time is refused
  while the first holds the sibling lock file `.NAME.lock` (experiment/store/lock.py)."""
from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import pathlib
import shutil
from typing import Iterator

from experiment.store import files, lock
from experiment.store.run import RunDir, RunError

MARKER = ".written_by"
# Files a command wrote before MARKER existed: a folder holding only these is that command's.
UNMARKED_OUTPUTS = {"report.py": ("ppl_vs_length.png", "ppl_vs_length.md", "loss_by_position.png", "attention_*.png",
                                  "passkey_vs_length.png", "passkey_heatmap_*.png", "passkey.md", "all_schemes.*")}
# The suffix of the free folder an error suggests instead.
SUGGESTED_SUFFIX = {"export_hf.py": "hf", "report.py": "report"}


def written_by(out: pathlib.Path) -> str | None:
    """The command MARKER names in `out`, or None."""
    marker = out / MARKER
    try:
        return marker.read_text().strip() or None if marker.is_file() else None
    except OSError:
        return None


def is_run_folder(folder: pathlib.Path) -> bool:
    """A run lives in `folder`: it has checkpoints, or a config.json that is a run's."""
    if (folder / "checkpoints").is_dir():
        return True
    try:
        return files.config_problem(json.loads(RunDir(folder).config_path.read_text())) is None
    except (OSError, ValueError):
        return False


def _free(out: pathlib.Path, command: str) -> pathlib.Path:
    """A folder beside `out` that does not exist yet."""
    out = out if out.name else pathlib.Path(os.path.abspath(out))  # `.`
    stem = f"{out.name}_{SUGGESTED_SUFFIX.get(command, 'out')}"
    candidates = (out.with_name(stem if n == 1 else f"{stem}{n}") for n in range(1, 1000))
    return next(p for p in candidates if not p.exists())


def claim(out: str | pathlib.Path, command: str, flag: str = "--out", instead: str | None = None) -> None:
    """Refuse (RunError, one line) unless `command` may write `out` (module docstring). The error
    names the folder as `flag OUT` and ends with `instead` (default: a free folder for `flag`)."""
    out = pathlib.Path(out)
    if not out.exists():
        return
    name = f"{flag} {out}" if flag.startswith("--") else f"{out} ({flag})"
    instead = instead or f"give a new or empty folder, e.g. {flag} {_free(out, command)}"
    if not out.is_dir():
        raise RunError(f"{name} is a file; {instead}")
    owner = written_by(out)
    if owner == command:
        return
    if owner is not None:
        raise RunError(f"{name} was written by {owner}, not {command}; {instead}")
    if is_run_folder(out):
        raise RunError(f"{name} is a run folder, which only its own run writes; {instead}")
    entries = sorted(p.name for p in out.iterdir())
    patterns = UNMARKED_OUTPUTS.get(command, ())
    if all((out / entry).is_file() and any(fnmatch.fnmatch(entry, p) for p in patterns) for entry in entries):
        return  # empty, or what this command wrote before it marked its folders
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    raise RunError(f"{name} holds files that {command} did not write ({shown}); {instead}")


@contextlib.contextmanager
def replacing(out: str | pathlib.Path, command: str, flag: str = "--out") -> Iterator[pathlib.Path]:
    """The folder to write `out`'s new content into (module docstring); swapped in as `out` when the
    block ends without an error, removed otherwise. `flag`: as for `claim`."""
    out = pathlib.Path(out)
    claim(out, command, flag)
    real = pathlib.Path(os.path.abspath(out))  # `--out .` has a name and a parent too
    real.parent.mkdir(parents=True, exist_ok=True)
    lock_path = real.parent / f".{real.name}.lock"
    release = lock.acquire(lock_path, command, name=f"{flag} {out}" if flag.startswith("--") else str(out),
                           instead=f"or give another --out, e.g. --out {_free(out, command)}")
    staging = real.parent / f".{real.name}.writing-{os.getpid()}"
    try:
        claim(out, command, flag)  # again, now that no other writer can change it
        for stale in (*real.parent.glob(f".{_escaped(real.name)}.writing-*"),
                      *real.parent.glob(f".{_escaped(real.name)}.old-*")):
            shutil.rmtree(stale, ignore_errors=True)  # left by a writer that was killed
        staging.mkdir()
        (staging / MARKER).write_text(f"{command}\n")
        yield staging
        _swap(staging, real)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        lock_path.unlink(missing_ok=True)  # while held: a writer that opened it before finds it busy
        release()


def _escaped(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _swap(staging: pathlib.Path, out: pathlib.Path) -> None:
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    try:
        staging.rename(out)
    except OSError:
        if old.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def moved(value, staging: pathlib.Path, out: pathlib.Path):
    """`value` (a path, or a dict / list of them, as the report writers return) with `staging`
    read as `out`: where the files are once swapped in."""
    if isinstance(value, dict):
        return {k: moved(v, staging, out) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(moved(v, staging, out) for v in value)
    if isinstance(value, (str, pathlib.Path)):
        try:
            relative = pathlib.Path(value).relative_to(staging)
        except ValueError:
            return value
        return type(value)(out / relative) if isinstance(value, pathlib.Path) else str(out / relative)
    return value
