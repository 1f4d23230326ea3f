"""The files of a run directory, as experiment/store/run.py reads and writes them: each written whole
(a temporary file renamed into place, so a kill never leaves half a file), each read back only
once its structure is checked: config.json (its sections and the types of its values),
init_from.json, metrics.jsonl lines, a checkpoint's meta item and the token streams; evaluation
records are checked by experiment/store/records.py. A check raises a ValueError or returns what is wrong
(None: nothing), and run.py turns that into an error naming the file and the command that repairs
it: nothing reads a field it has not checked.

A full device is one line whatever library was writing (`space_for`, NoSpace): "no space left on
device: FILE (N MB needed)"."""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import pathlib
import re
import shutil

import numpy as np

from experiment import config as config_lib
from experiment.store import records


def checked_origin(path: pathlib.Path) -> dict:
    """init_from.json: {workdir, step, scheme, train_length} (ValueError saying what is wrong)."""
    origin = json.loads(path.read_text())
    kinds = {"workdir": str, "step": int, "scheme": str, "train_length": int}
    if not isinstance(origin, dict) or not all(isinstance(origin.get(k), t) for k, t in kinds.items()):
        raise ValueError(f"expected {{{', '.join(kinds)}}}")
    return origin


def check_meta(meta, step: int) -> None:
    """A checkpoint's meta item names its step and data position (ValueError otherwise)."""
    if not isinstance(meta, dict) or meta.get("step") != step or not isinstance(meta.get("data_position"), int):
        raise ValueError(f"its meta item is damaged (expected step {step} and a data position, got {meta!r:.80})")


def checked_stream(path: pathlib.Path, meta: pathlib.Path, vocab_size: int) -> tuple[np.ndarray, int]:
    """(stream, words) from the cache files, each checked (ValueError saying what is wrong)."""
    try:
        info = json.loads(meta.read_text())
        stream = np.load(path)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(first_line(e)) from None
    if not isinstance(info, dict) or not all(isinstance(info.get(k), int) for k in ("words", "tokens")):
        raise ValueError(f"{meta.name} lacks its word and token counts")
    if stream.ndim != 1 or not np.issubdtype(stream.dtype, np.integer) or len(stream) != info["tokens"]:
        raise ValueError(f"expected {info['tokens']:,} token ids, found an array of {stream.dtype} {stream.shape}")
    if len(stream) and (stream.min() < 0 or stream.max() >= vocab_size):
        raise ValueError(f"token ids outside the vocabulary of {vocab_size:,}")
    return stream, info["words"]


def write_atomically(path: pathlib.Path, text: str) -> None:
    write_bytes_atomically(path, text.encode())


def write_bytes_atomically(path: pathlib.Path, data: bytes) -> None:
    """`data` written whole as `path` (a temporary file renamed into place); a full device is NoSpace."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with space_for(path, len(data), tmp):
        tmp.write_bytes(data)
    tmp.replace(path)


def save_array_atomically(path: pathlib.Path, array: np.ndarray) -> None:
    """An .npy file written whole (a temporary file renamed into place)."""
    tmp = path.with_suffix(".tmp.npy")
    with space_for(path, array.nbytes + 128, tmp):
        np.save(tmp, array)
    tmp.replace(path)


# --- a full device ---------------------------------------------------------------------------------

class NoSpace(OSError):
    """The device filled up while `path` was written: "no space left on device: FILE (N MB needed)"."""

    def __init__(self, path: str | pathlib.Path, needed: int | None = None):
        size = f" ({max(1, math.ceil(needed / 1e6)):,} MB needed)" if needed else ""
        super().__init__(errno.ENOSPC, f"no space left on device: {path}{size}", str(path))
        self.needed = needed

    def __str__(self) -> str:
        return self.strerror


_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")  # numpy's tofile on a full device


def out_of_space(error: BaseException | None) -> NoSpace | OSError | None:
    """The error in `error`'s chain (itself, or what it was raised from) that says the device is
    full: ENOSPC, EDQUOT, or a short write as numpy reports it; None if none does."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        if _SHORT_WRITE.search(str(error)) or "No space left on device" in str(error):
            return error if isinstance(error, OSError) else OSError(errno.ENOSPC, str(error))
        error = error.__cause__ or error.__context__
    return None


def free_bytes(path: pathlib.Path) -> int | None:
    """Free bytes on the device that holds `path` (or its nearest existing parent); None if unknown."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


@contextlib.contextmanager
def space_for(path: pathlib.Path, needed: int, *leftovers: pathlib.Path):
    """The block writes `path` (`needed` bytes): refused at once where the device has less free, and
    an error of the block that says the device is full becomes NoSpace naming `path`; `leftovers`
    (its temporary files) are then removed."""
    path = pathlib.Path(path)
    free = free_bytes(path)
    if free is not None and free < needed:
        raise NoSpace(path, needed)
    try:
        yield
    except Exception as e:
        if isinstance(e, NoSpace) or not out_of_space(e):
            raise
        for leftover in leftovers:
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        raise NoSpace(path, needed) from None


def first_line(error: BaseException | None) -> str:
    """An error's first line, short (a missing key reads as such, not as a bare quoted name)."""
    if isinstance(error, KeyError) and error.args:
        key = error.args[0]
        return f"no {key!r} in it" if isinstance(key, str) and key.isidentifier() else str(key)[:200]
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200] if error else ""


_KIND = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list"}


def config_problem(saved) -> str | None:
    """What makes a parsed config.json not a saved config (None: nothing found)."""
    if not isinstance(saved, dict):
        return f"it holds a JSON {records.json_type(saved)}, not an object"
    missing = [name for name in ("data", "model", "train", "posenc") if not isinstance(saved.get(name), dict)]
    if missing:
        return f"no {', '.join(missing)} section"
    if not isinstance(saved["posenc"].get("name"), str):
        return "posenc.name is not a scheme name"
    for name, cls in config_lib.SECTIONS.items():
        section = saved.get(name)
        for field in dataclasses.fields(cls) if isinstance(section, dict) else ():
            if field.default is dataclasses.MISSING:
                continue
            if field.name in section and not _same_type(section[field.name], field.default):
                return f"{name}.{field.name} = {section[field.name]!r} is not {_KIND.get(type(field.default), 'valid')}"
    return None


def _same_type(value, default) -> bool:
    """A saved value can stand where the default stands (an int for a float, a list for a tuple)."""
    if isinstance(default, bool) or default is None:
        return isinstance(value, bool) or default is None
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def metrics_step(line: str) -> int | None:
    """The step of one metrics.jsonl line; None for a line that is not a JSON object with an integer step."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
