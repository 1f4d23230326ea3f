"""A built-in corpus that needs no download: the English documentation bundled with Python.

Documents are the interpreter's help topics (`pydoc_data.topics`, the text behind `help('if')`)
and the docstrings of the standard-library modules (module, class and function docstrings, read
with `ast` without importing anything). Each document goes to train / valid / test by a checksum
of its name (about 85% / 5% / 10% of the text), so the split is the same on every machine with the same Python
version. About 1.3 MB of text on Python 3.11.
"""
from __future__ import annotations

import ast
import functools
import pathlib
import sysconfig
import zlib

BUILTIN_CORPORA = ("python_docs",)


@functools.lru_cache(maxsize=1)
def python_docs_documents() -> tuple[tuple[str, str], ...]:
    """(name, text) for every help topic and every stdlib module with docstrings, in a fixed order."""
    docs = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the docstrings still exist
        topics = {}
    for key in sorted(topics):
        docs.append((f"topic:{key}", topics[key]))
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        parts = [ast.get_docstring(node) for node in ast.walk(tree)
                 if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        text = "\n\n".join(p for p in parts if p)
        if text:
            docs.append((f"module:{path.stem}", text))
    if not docs:
        raise RuntimeError("the built-in corpus is empty: this Python has neither pydoc_data nor stdlib sources")
    return tuple(docs)


def split_of(document_name: str) -> str:
    bucket = zlib.crc32(document_name.encode()) % 20
    return "valid" if bucket == 0 else "test" if bucket == 1 else "train"


def builtin_lines(name: str, split: str) -> list[str]:
    """The lines of one split of a built-in corpus."""
    if name not in BUILTIN_CORPORA:
        raise ValueError(f"unknown built-in corpus {name!r}; available: {', '.join(BUILTIN_CORPORA)}")
    lines: list[str] = []
    for doc_name, text in python_docs_documents():
        if split_of(doc_name) == split:
            lines.extend(line.rstrip() for line in text.split("\n"))
    return lines
