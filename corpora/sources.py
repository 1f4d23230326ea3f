"""Where text comes from: `data.source` is `builtin` (a corpus bundled with Python), `local` (a
folder of text files) or `hf` (Hugging Face `datasets`: a local dataset folder or a hub name).

Every source returns one split as a list of lines (without their newline); `check_splits` checks
before any training that the splits a run needs are there, without reading them.
"""
from __future__ import annotations

import dataclasses

from collections.abc import Iterable
from typing import Any

from corpora.builtin import BUILTIN_CORPORA, builtin_lines
from corpora.hf_source import check_hf_splits, hf_lines
from corpora.local_source import check_local_splits, local_lines
from corpora.splits import DataError, split_aliases

SOURCES = ("builtin", "local", "hf")


def _as_mapping(data_cfg: Any):
    """The `data` block as a mapping: a dict, a ConfigDict, or the typed DataConfig (a dataclass)."""
    return dataclasses.asdict(data_cfg) if dataclasses.is_dataclass(data_cfg) else data_cfg


def _source(data_cfg: Any) -> str:
    source = data_cfg["source"]
    if source not in SOURCES:
        raise DataError(f"unknown data.source {source!r}; valid: {', '.join(SOURCES)} (--config.data.source)")
    return source


def _check_builtin_name(name: str) -> None:
    if name not in BUILTIN_CORPORA:
        raise DataError(f"unknown built-in corpus {name!r}; available: {', '.join(BUILTIN_CORPORA)} "
                        f"(--config.data.name)")


def load_lines(data_cfg: Any, split: str) -> list[str]:
    """One split of the corpus that `data_cfg` (the config's `data` block) names."""
    data_cfg = _as_mapping(data_cfg)
    source = _source(data_cfg)
    if source == "builtin":
        _check_builtin_name(data_cfg["name"])
        return builtin_lines(data_cfg["name"], split)
    if source == "local":
        return local_lines(data_cfg["path"], split)
    return hf_lines(data_cfg.get("path", ""), data_cfg.get("name", ""), data_cfg.get("hf_config", ""), split,
                    data_cfg.get("text_column", "text"))


def check_splits(data_cfg: Any, splits: Iterable[str]) -> None:
    """Raise DataError unless every split in `splits` can be loaded as far as cheap checks tell,
    reading no text and contacting no network: the split names; builtin: the corpus name; local:
    the folder and a non-empty file per split (the error names the missing splits, the folder and
    the file names expected); hf: a local folder's layout (save_to_disk splits or data file names),
    nothing for a hub name."""
    data_cfg = _as_mapping(data_cfg)
    source = _source(data_cfg)
    splits = list(dict.fromkeys(splits))
    for split in splits:
        split_aliases(split)
    if source == "builtin":
        _check_builtin_name(data_cfg["name"])
    if source == "local":
        check_local_splits(data_cfg["path"], splits)
    if source == "hf":
        check_hf_splits(data_cfg.get("path", ""), data_cfg.get("name", ""), splits)
