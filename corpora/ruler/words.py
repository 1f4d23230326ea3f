"""The words of the RULER tasks that draw random words (the keys of the word-keyed needles, the
common-words list of cwe): `vocabulary()`, 5,000 common lower-case English words kept in words.txt.

RULER draws them from the `wonderwords` package (its adjectives and nouns: keys "adjective-noun";
its nouns, adjectives and verbs: the cwe list). Here they come from the four public-domain books
(corpora/books.py), so that nothing beyond the books is needed and the list is fixed: words of 4-10
letters written in lower case at least 9 times in 10 and at least 5 times in all, by frequency,
skipping the 100 most frequent (function words: "that", "with", "which"), then the next 5,000.
`derive(books)` makes the list; words.txt is its output, kept so that a prompt does not change with
anything installed (`python -m corpora.ruler.words` writes it again).
"""
from __future__ import annotations

import collections
import functools
import pathlib
import re

FILE = pathlib.Path(__file__).with_name("words.txt")
SKIP, KEEP = 100, 5000
_WORD = re.compile(r"(?<![\w'-])[A-Za-z]+(?![\w'-])")


def derive(texts) -> list[str]:
    """The vocabulary of `texts` (strings) as the module docstring says, sorted alphabetically."""
    lower, other = collections.Counter(), collections.Counter()
    for text in texts:
        for word in _WORD.findall(text):
            (lower if word.islower() else other)[word.lower()] += 1
    ranked = [w for w, n in lower.most_common() if n >= 5 and 4 <= len(w) <= 10 and n >= 9 * other[w]]
    return sorted(ranked[SKIP:SKIP + KEEP])


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """The kept list (words.txt), sorted, one word a line."""
    return tuple(FILE.read_text().split())


if __name__ == "__main__":
    from corpora.books import books
    FILE.write_text("\n".join(derive(book.text for book in books())) + "\n")
    print(f"wrote {FILE}: {len(vocabulary.__wrapped__())} words")
