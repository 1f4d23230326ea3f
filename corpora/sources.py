"""Where text comes from: a built-in corpus, a local folder, or a Hugging Face `datasets` name.

Every source returns one split as a list of lines (without their newline). Splits have logical
names `train`, `valid` and `test`; the aliases below map them to the names files and hubs use.
"""
from __future__ import annotations

import pathlib
import re
from typing import Any

from corpora.builtin import builtin_lines

SPLIT_ALIASES = {"train": ("train",), "valid": ("valid", "validation", "val", "dev"), "test": ("test",)}
SOURCES = ("builtin", "local", "hf")


class DataError(ValueError):
    """The data named by the config cannot be found or read; the message says how to fix it."""


def _aliases(split: str) -> tuple[str, ...]:
    if split not in SPLIT_ALIASES:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLIT_ALIASES)}")
    return SPLIT_ALIASES[split]


def read_lines(path: pathlib.Path) -> list[str]:
    """Lines of a text file split on '\\n' only (WikiText has other Unicode line separators inside lines)."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def local_split_files(folder: pathlib.Path, split: str) -> list[pathlib.Path]:
    """Files of `split` in `folder`: a sub-folder named after the split (all its files), or files
    whose name has the split as a component, e.g. `wiki.valid.tokens`, `valid.txt`, `test-01.txt`."""
    aliases = _aliases(split)
    for alias in aliases:
        sub = folder / alias
        if sub.is_dir():
            return sorted(p for p in sub.iterdir() if p.is_file() and not p.name.startswith("."))
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                  and any(a in re.split(r"[._\-]", p.name) for a in aliases))


def local_lines(path: str, split: str) -> list[str]:
    folder = pathlib.Path(path).expanduser()
    if not path or not folder.is_dir():
        raise DataError(f"data folder {path!r} does not exist; set --config.data.path to a folder with "
                        f"one text file per split (e.g. wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens)")
    files = local_split_files(folder, split)
    if not files:
        present = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
        raise DataError(f"no file for split {split!r} in {folder} (it holds: {present}); name files like "
                        f"wiki.{split}.tokens or {split}.txt, or train on another split with "
                        f"--config.data.train_split=valid")
    lines: list[str] = []
    for file in files:
        lines.extend(read_lines(file))
    return lines


def hf_lines(name: str, hf_config: str, split: str, text_column: str = "text") -> list[str]:
    """One split of a `datasets` dataset: a hub name (`Salesforce/wikitext`) or a local dataset folder."""
    import datasets  # heavy; imported only when used

    last_error: Exception | None = None
    for alias in _aliases(split):
        try:
            ds = datasets.load_dataset(name, hf_config or None, split=alias)
        except ValueError as e:  # unknown split name: try the next alias
            last_error = e
            if "split" in str(e).lower():
                continue
            break
        except Exception as e:  # offline, not found, ...: all end in the same advice
            last_error = e
            break
        else:
            if text_column not in ds.column_names:
                raise DataError(f"dataset {name!r} has no column {text_column!r}; columns: {ds.column_names}; "
                                f"set --config.data.text_column")
            return [row.rstrip("\n") for row in ds[text_column]]
    raise DataError(
        f"could not load split {split!r} of dataset {name!r}"
        f"{f' ({hf_config})' if hf_config else ''} with HF datasets: {type(last_error).__name__}: "
        f"{str(last_error).splitlines()[0] if str(last_error) else ''}\n"
        f"If this machine is offline, download the data elsewhere and point the config at the files: "
        f"--config.data.source=local --config.data.path=/path/to/folder (files wiki.train.tokens, "
        f"wiki.valid.tokens, wiki.test.tokens or train.txt, valid.txt, test.txt)")


def load_lines(data_cfg: Any, split: str) -> list[str]:
    """One split of the corpus that `data_cfg` (the config's `data` block) names."""
    source = data_cfg["source"]
    if source == "builtin":
        return builtin_lines(data_cfg["name"], split)
    if source == "local":
        return local_lines(data_cfg["path"], split)
    if source == "hf":
        return hf_lines(data_cfg["name"], data_cfg.get("hf_config", ""), split,
                        data_cfg.get("text_column", "text"))
    raise DataError(f"unknown data.source {source!r}; valid: {', '.join(SOURCES)}")
