"""Split names every source shares, and DataError, the error every source raises.

Splits have logical names `train`, `valid` and `test`; the aliases map them to the names that
files, folders and Hugging Face datasets use (`validation`, `dev`, ...).
"""
from __future__ import annotations

SPLIT_ALIASES = {"train": ("train",), "valid": ("valid", "validation", "val", "dev"), "test": ("test",)}


class DataError(ValueError):
    """The data named by the config cannot be found or read; the message (one line) says how to fix it."""


def split_aliases(split: str) -> tuple[str, ...]:
    """The names `split` may have in files and datasets; DataError for an unknown split."""
    if split not in SPLIT_ALIASES:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLIT_ALIASES)}")
    return SPLIT_ALIASES[split]


def logical_split(name: str) -> str | None:
    """`valid` for 'validation', 'dev', ...; None when `name` is no split name."""
    for split, aliases in SPLIT_ALIASES.items():
        if name.lower() in aliases:
            return split
    return None
