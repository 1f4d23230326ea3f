"""The files of a run directory, as experiment/run.py reads and writes them: each written whole
(a temporary file renamed into place, so a kill never leaves half a file), each read back only
once its structure is checked (a ValueError saying what is wrong, which run.py turns into an error
naming the file and the command that repairs it)."""
from __future__ import annotations

import contextlib
import gc
import json
import pathlib
import sys

import numpy as np


@contextlib.contextmanager
def quiet_abandoned_reads():
    """A failed orbax restore leaves its other reads' coroutines unawaited; Python would print each
    one's error with a page of TensorStore spec whenever they are collected (often much later).
    From the first failed restore on, those (and only those) are dropped quietly."""
    try:
        yield
    except Exception:
        if not getattr(sys.unraisablehook, "drops_orbax_reads", False):
            previous = sys.unraisablehook

            def hook(unraisable):
                code = getattr(unraisable.object, "cr_code", None)
                if code is None or "orbax" not in code.co_filename:
                    previous(unraisable)
            hook.drops_orbax_reads = True
            sys.unraisablehook = hook
        gc.collect()
        raise


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
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def first_line(error: BaseException | None) -> str:
    """An error's first line, short (a missing key reads as such, not as a bare quoted name)."""
    if isinstance(error, KeyError) and error.args:
        key = error.args[0]
        return f"no {key!r} in it" if isinstance(key, str) and key.isidentifier() else str(key)[:200]
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200] if error else ""
