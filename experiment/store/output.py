"""Folders that commands write outside a run (export_hf.py --out, report.py --out, a sweep's
report/): a command writes only into a folder it owns, and there replaces only the files it wrote.

- `claim(out, command)`: `out` is new, empty, or was written by `command` before (it holds MARKER,
  whose first line names the command and whose other lines list the files it wrote; a report
  folder written before markers existed is recognised by its file names alone). A run folder, a
  folder another command wrote, or an unmarked one holding anyone else's files is refused with one
  line that names the folder and a free one to use instead.
- `replacing(out, command)`: the whole output is written into a hidden sibling folder first; at the
  end its files replace those that the earlier call wrote (MARKER's list), and the earlier call's
  files that this one did not write again are removed. Any other file in `out` (a user's notes.txt)
  stays; where one has the name of a file this call wrote, the write is refused naming it and `out`
  is left as it was. A failed or interrupted call leaves `out` as it was (the files are moved in
  with Ctrl-C and SIGTERM held back, and MARKER lists every file of both calls while they are, so
  even a kill leaves nothing of the command's unknown to its next call). A full device while the
  output is written is one line naming the file in `out` (experiment/store/files.py: NoSpace). A
  second writer of `out` at the same time is refused while the first holds the sibling lock file
  `.NAME.lock` (experiment/store/lock.py)."""
from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import pathlib
import shutil
import signal
import threading
from typing import Iterator

from experiment.store import files, lock
from experiment.store.run import RunDir, RunError

MARKER = ".written_by"
# What each command wrote before MARKER listed its files: an unmarked report folder holding only
# these is report.py's; in a folder whose MARKER names only the command, these are its files.
UNMARKED_OUTPUTS = {"report.py": ("ppl_vs_length.png", "ppl_vs_length.md", "loss_by_position.png", "attention_*.png",
                                  "passkey_vs_length.png", "passkey_heatmap_*.png", "passkey.md", "all_schemes.*"),
                    "export_hf.py": ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")}
# The suffix of the free folder an error suggests instead.
SUGGESTED_SUFFIX = {"export_hf.py": "hf", "report.py": "report"}


def _marker_lines(out: pathlib.Path) -> list[str] | None:
    marker = out / MARKER
    try:
        return marker.read_text().splitlines() if marker.is_file() else None
    except (OSError, UnicodeDecodeError):
        return None


def written_by(out: pathlib.Path) -> str | None:
    """The command MARKER names in `out`, or None."""
    lines = _marker_lines(out)
    return (lines[0].strip() or None) if lines else None


def written_files(out: pathlib.Path, command: str) -> set[str]:
    """The files (paths relative to `out`, with /) that `command` wrote in `out`: MARKER's list, or
    where MARKER (or an unmarked report folder) predates the list, its files named as the command
    names its outputs (UNMARKED_OUTPUTS)."""
    lines = _marker_lines(out)
    if lines and len(lines) > 1:
        return {line for line in lines[1:] if line.strip()}
    patterns = UNMARKED_OUTPUTS.get(command, ())
    return {p.name for p in out.iterdir() if p.is_file() and any(fnmatch.fnmatch(p.name, g) for g in patterns)}


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
    patterns = UNMARKED_OUTPUTS.get(command, ()) if command == "report.py" else ()  # export_hf.py always marked
    if all((out / entry).is_file() and any(fnmatch.fnmatch(entry, p) for p in patterns) for entry in entries):
        return  # empty, or what this command wrote before it marked its folders
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    raise RunError(f"{name} holds files that {command} did not write ({shown}); {instead}")


@contextlib.contextmanager
def replacing(out: str | pathlib.Path, command: str, flag: str = "--out") -> Iterator[pathlib.Path]:
    """The folder to write `out`'s new content into (module docstring); its files replace the earlier
    call's in `out` when the block ends without an error, and are removed otherwise. `flag`: as for
    `claim`."""
    out = pathlib.Path(out)
    claim(out, command, flag)
    real = pathlib.Path(os.path.abspath(out))  # `--out .` has a name and a parent too
    real.parent.mkdir(parents=True, exist_ok=True)
    lock_path = real.parent / f".{real.name}.lock"
    release = lock.acquire(lock_path, command, name=f"{flag} {out}" if flag.startswith("--") else str(out),
                           instead=f"or give another --out, e.g. --out {_free(out, command)}",
                           unwritable=f"{command} writes {flag} {out} there; give a {flag} in a folder you can write")
    staging = real.parent / f".{real.name}.writing-{os.getpid()}"
    try:
        claim(out, command, flag)  # again, now that no other writer can change it
        for stale in real.parent.glob(f".{_escaped(real.name)}.writing-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a writer that was killed (nothing moved out yet)
        staging.mkdir()
        try:
            yield staging
        except Exception as e:
            full = files.out_of_space(e)
            if full is None:
                raise
            raise _named(full, staging, out) from None
        _install(staging, real, command)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        lock_path.unlink(missing_ok=True)  # while held: a writer that opened it before finds it busy
        release()


def _escaped(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _named(full: OSError, staging: pathlib.Path, out: pathlib.Path) -> files.NoSpace:
    """A full device while the output was written aside, as NoSpace naming the file in `out`: the
    file the error names (with the size it needed, where the writer said), else the one written last."""
    path = pathlib.Path(full.filename) if isinstance(full.filename, (str, pathlib.Path)) else None
    if path is None or staging not in path.parents:
        written = [p for p in staging.rglob("*") if p.is_file()]
        path = max(written, key=lambda p: p.stat().st_mtime_ns) if written else staging
    return files.NoSpace(moved(path, staging, out), getattr(full, "needed", None))


def _files_under(folder: pathlib.Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.name != MARKER)


def _install(staging: pathlib.Path, out: pathlib.Path, command: str) -> None:
    """Put the files of `staging` in `out` in place of those the earlier call of `command` wrote."""
    new = _files_under(staging)
    if not out.exists():
        _mark(staging, command, new)
        staging.rename(out)
        return
    old = written_files(out, command)
    for name in new:
        parts = pathlib.PurePosixPath(name).parts
        for depth in range(1, len(parts) + 1):
            taken = out.joinpath(*parts[:depth])
            inner = depth < len(parts)
            if (taken.exists() and (not taken.is_dir() if inner else name not in old)) or taken.is_symlink():
                raise RunError(f"{taken} is not a file {command} wrote, and it writes one of that name; move it "
                               f"away and run the command again (nothing in {out} was changed)")
    with _signals_held():
        _mark(out, command, sorted(old | set(new)))  # a kill from here on leaves no file of ours unlisted
        for name in new:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, out / name)
        for name in sorted(old - set(new)):
            _remove(out, name)
        _mark(out, command, new)


def _mark(folder: pathlib.Path, command: str, names: list[str]) -> None:
    files.write_atomically(folder / MARKER, "".join(f"{line}\n" for line in (command, *names)))


def _remove(out: pathlib.Path, name: str) -> None:
    """An earlier call's file that this call did not write again, and its folders left empty."""
    path = out / name
    if not path.is_file() or path.is_symlink():
        return
    path.unlink()
    for folder in path.parents:
        if folder == out or any(folder.iterdir()):
            break
        folder.rmdir()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (the files of two calls are not left mixed),
    then take effect as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in dict.fromkeys(caught):
            os.kill(os.getpid(), s)


def moved(value, staging: pathlib.Path, out: pathlib.Path):
    """`value` (a path, or a dict / list of them, as the report writers return) with `staging`
    read as `out`: where the files are once moved in."""
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
