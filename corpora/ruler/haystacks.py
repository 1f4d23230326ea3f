"""What the RULER tasks draw: random keys and values (7-digit numbers, UUIDs, word pairs, variable
names), the depths a needle may sit at, seeded random streams, and the book haystack (a stretch of
one of corpora/books.py's books, cut into sentences) that stands in for RULER's essays.
"""
from __future__ import annotations

import functools
import random
import re
import string
import uuid
from typing import Callable, Sequence

from corpora.ruler.words import vocabulary

# RULER's 40 needle depths (percent of the sentences before the needle): round(linspace(0, 100, 40)).
DEPTHS = tuple(round(100 * i / 39) for i in range(40))
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])")


def stream(seed: str, purpose: str) -> random.Random:
    """A random stream of its own for each (example seed, purpose): what one draw takes does not shift
    another's, so an example's keys stay the same whatever size its haystack is tried at."""
    return random.Random(f"{seed}/{purpose}")


def number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))


def uuid4(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def word_pair(rng: random.Random) -> str:
    """A key of two words ('tangible-lantern'; RULER: an adjective and a noun of wonderwords)."""
    words = vocabulary()
    return f"{rng.choice(words)}-{rng.choice(words)}"


def variable(rng: random.Random, letters: int) -> str:
    return "".join(rng.choices(string.ascii_uppercase, k=letters))


DRAWS: dict[str, Callable[[random.Random], str]] = {"numbers": number, "uuids": uuid4, "words": word_pair}


def distinct(rng: random.Random, draw: Callable[[random.Random], str], count: int, avoid: Sequence[str] = ()) -> list[str]:
    """`count` different draws, none of them in `avoid`."""
    out: list[str] = []
    while len(out) < count:
        value = draw(rng)
        if value not in out and value not in avoid:
            out.append(value)
    return out


# The books of the haystack: the two novels (prose from end to end; the other two books end in an
# index of page numbers, which has no sentences to put needles between).
HAYSTACK_BOOKS = ("The Adventures of Sherlock Holmes", "War and Peace")


@functools.lru_cache(maxsize=2)
def book_words(path: str | None = None) -> tuple[str, ...]:
    """The words of the haystack's books (corpora/books.py; `path`: another big.txt), whitespace
    collapsed as RULER collapses its essays', one book after the other."""
    from corpora.books import books
    return tuple(word for book in books(path) if book.title in HAYSTACK_BOOKS for word in book.text.split())


def sentence_start(words: Sequence[str], index: int) -> int:
    """The first sentence start at or after word `index`, where one is within 200 words; else `index`."""
    for i in range(index, min(index + 200, len(words))):
        if words[i - 1].endswith((".", "!", "?")) and words[i][:1].isupper():
            return i
    return index


def stretch_start(words: Sequence[str], rng: random.Random) -> int:
    """Where a stretch of `words` begins: a random word, moved to the next sentence start where one is
    near (RULER takes its essays from their beginning; a random start gives each example its own text)."""
    if not words:
        raise ValueError("the book haystack is empty")
    return sentence_start(words, rng.randrange(len(words)))


def book_stretch(words: Sequence[str], rng: random.Random, count: int, start: int | None = None) -> str:
    """`count` words of `words` from `start` (None: `stretch_start`), wrapping round where the words end.
    Two stretches of one cell can share text; `book_span` says which words a stretch holds."""
    start = stretch_start(words, rng) if start is None else start
    return " ".join(words[(start + i) % len(words)] for i in range(count))


def book_span(words: Sequence[str], rng: random.Random, count: int, start: int | None = None) -> tuple[int, int]:
    """(first word, words) of the stretch `book_stretch` takes with the same stream, count and start."""
    return (stretch_start(words, rng) if start is None else start), int(count)


def disjoint_starts(words: Sequence[str], words_each: int, seed: str, margin: float = 1.1) -> list[int]:
    """Starts of stretches of about `words_each` words that share no text: the words cut into as many
    slots as hold `margin` times that many, taken in an order shuffled by `seed`, each moved to its
    first sentence start. A stretch that comes out longer than its slot reaches into the next."""
    slots = max(1, int(len(words) // (margin * words_each)))
    width = len(words) // slots
    order = list(range(slots))
    random.Random(f"{seed}/stretches").shuffle(order)
    return [sentence_start(words, slot * width) for slot in order]


def sentences(text: str) -> list[str]:
    """`text` cut after each sentence's end (., ! or ?, closing quotes kept) before a capital, a digit
    or an opening quote (RULER uses nltk's sent_tokenize; this needs nothing installed)."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]
