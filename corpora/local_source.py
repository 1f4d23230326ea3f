"""`data.source=local`: a folder of UTF-8 text files, one or more per split.

A split's files are a sub-folder named after the split (all its files), or the files whose name
has the split as a component: `wiki.valid.tokens`, `valid.txt`, `validation.txt`, `test-01.txt`.
"""
from __future__ import annotations

import pathlib
import re
from collections.abc import Iterable

from corpora.splits import DataError, split_aliases


def read_lines(path: pathlib.Path) -> list[str]:
    """Lines of a UTF-8 text file split on '\\n' only (WikiText has other Unicode line separators
    inside lines), without their '\\n' or a trailing '\\r'. Invalid UTF-8: a DataError naming the
    file, the byte offset and the line."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"{path} is not valid UTF-8 (byte {e.start}, line {line}: {data[e.start:e.start + 4]!r}); convert it, "
            f"e.g. iconv -f latin1 -t utf-8 {path} > {path.name}.utf8 and put that in its place, "
            f"or move the file out of --config.data.path") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def local_split_files(folder: pathlib.Path, split: str) -> list[pathlib.Path]:
    """Files of `split` in `folder` (see the module docstring), sorted; [] when there are none."""
    aliases = split_aliases(split)
    for alias in aliases:
        sub = folder / alias
        if sub.is_dir():
            return sorted(p for p in sub.iterdir() if p.is_file() and not p.name.startswith("."))
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                  and any(a in re.split(r"[._\-]", p.name) for a in aliases))


def local_folder(path: str) -> pathlib.Path:
    """The folder `path` names; DataError naming data.path when it does not exist."""
    folder = pathlib.Path(path).expanduser()
    if not path or not folder.is_dir():
        raise DataError(f"data folder {path!r} does not exist; set --config.data.path to a folder with "
                        f"one text file per split (e.g. wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens)")
    return folder


def expected_names(split: str) -> str:
    """The file names `split` may have, for an error message."""
    others = split_aliases(split)[1:]
    also = f" ({split} may also be {', '.join(others)})" if others else ""
    return f"for {split!r}: wiki.{split}.tokens, {split}.txt or a sub-folder {split}/{also}"


def check_local_splits(path: str, splits: Iterable[str]) -> dict[str, list[pathlib.Path]]:
    """The files of each split, after checking (without reading them) that the folder exists and
    that every split has at least one non-empty file; DataError naming the missing splits, the
    folder and the file names expected."""
    folder = local_folder(path)
    files = {split: local_split_files(folder, split) for split in dict.fromkeys(splits)}
    missing = [s for s, f in files.items() if not f]
    if missing:
        present = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
        hint = " (or train on another split with --config.data.train_split=valid)" if "train" in missing else ""
        raise DataError(f"no file for split{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))} in "
                        f"--config.data.path={folder} (it holds: {present}); expected "
                        f"{'; '.join(map(expected_names, missing))}{hint}")
    empty = [s for s, f in files.items() if all(p.stat().st_size == 0 for p in f)]
    if empty:
        raise DataError(f"the files of split {', '.join(map(repr, empty))} in --config.data.path={folder} are "
                        f"empty: {', '.join(p.name for s in empty for p in files[s])}")
    return files


def local_lines(path: str, split: str) -> list[str]:
    """The lines of one split: its files' lines, file after file."""
    lines: list[str] = []
    for file in check_local_splits(path, [split])[split]:
        lines.extend(read_lines(file))
    return lines
