"""A built-in corpus that needs no download: the English documentation bundled with Python.

Documents are the interpreter's help topics (`pydoc_data.topics`, the text behind `help('if')`)
and the docstrings of the standard-library modules (module, class and function docstrings, read
with `ast` without importing anything). Each document goes to train / valid / test by a checksum
of its name (about 85% / 5% / 10% of the text), so the split is the same on every machine with the same Python
version. About 1.3 MB of text on Python 3.11.

Reading the ~240 modules takes 1-2 s, which every process that trains or scores on this corpus (each run of
the demo, each test that starts one) would pay again: the documents are kept in one JSON file under
`~/.cache/lengthx/corpora/` (`$XDG_CACHE_HOME`; `LX_CORPUS_CACHE=DIR` picks another folder, `off` none),
named by a hash of the Python version, the sources read (names, sizes, modification times) and this file,
so another Python, an upgraded standard library or an edit here builds it again.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import pathlib
import sys
import sysconfig
import tempfile
import zlib

BUILTIN_CORPORA = ("python_docs",)


@functools.lru_cache(maxsize=1)
def python_docs_documents() -> tuple[tuple[str, str], ...]:
    """(name, text) for every help topic and every stdlib module with docstrings, in a fixed order: read
    from the cache file when one for these sources exists, else built and written there."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    modules = sorted(stdlib.glob("*.py"))
    cached = _cache_file(modules)
    if cached is not None:
        try:
            return tuple((name, text) for name, text in json.loads(cached.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):  # absent, or damaged (a full disk)
            pass
    docs = _read_documents(modules)
    if cached is not None:
        _write_whole(cached, json.dumps(docs))
    return docs


def _read_documents(modules: list[pathlib.Path]) -> tuple[tuple[str, str], ...]:
    docs = []
    for key, text in sorted(_topics().items()):
        docs.append((f"topic:{key}", text))
    for path in modules:
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


def _topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the docstrings still exist
        return {}
    return topics


def _cache_file(modules: list[pathlib.Path]) -> pathlib.Path | None:
    """The cache file for these sources (None: LX_CORPUS_CACHE=off)."""
    chosen = os.environ.get("LX_CORPUS_CACHE", "")
    if chosen.lower() in ("off", "0", "none"):
        return None
    folder = pathlib.Path(chosen) if chosen else pathlib.Path(
        os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "lengthx" / "corpora"
    digest = hashlib.sha256(sys.version.encode())
    digest.update(pathlib.Path(__file__).read_bytes())
    topics = importlib.util.find_spec("pydoc_data.topics") if importlib.util.find_spec("pydoc_data") else None
    for path in ([pathlib.Path(topics.origin)] if topics and topics.origin else []) + modules:
        try:
            stat = path.stat()
        except OSError:
            continue
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return folder / f"python_docs-{digest.hexdigest()[:20]}.json"


def _write_whole(path: pathlib.Path, text: str) -> None:
    """Write by renaming a finished temporary file into place (concurrent writers: one wins, both whole);
    a folder that cannot be written only means no cache."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False,
                                         suffix=".tmp") as f:
            temporary = pathlib.Path(f.name)
            f.write(text)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            temporary.unlink(missing_ok=True)


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
