"""RULER's needle-in-a-haystack tasks (scripts/data/synthetic/niah.py): needles "One of the special
magic numbers for KEY is: VALUE." hidden in a haystack, the values of some keys asked for after it.

Haystacks: `noise` (RULER's "The grass is green. ..." line repeated, one a line, needles between
lines at random), `needle` (every line a needle of another key: distractors), `book` (a stretch of a
book in place of RULER's essays, needles between its sentences at RULER's 40 depths). Keys and
values: 7-digit numbers, UUIDs or word pairs. With one value asked for, the template speaks of one
("A special magic number is hidden ... What is the special magic number for KEY ..."), as RULER's.
"""
from __future__ import annotations

from typing import Sequence

from corpora.ruler.haystacks import DEPTHS, DRAWS, book_stretch, distinct, sentences, stream
from corpora.ruler.prompt import Example
from corpora.ruler.tasks import NEEDLE, NIAH_PREFIX, NIAH_TEMPLATE, NOISE, Task


def _singular(text: str) -> str:
    """RULER's wording for one value asked: its replacements, in its order."""
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(old, new)
    return text


def haystack_units(task: Task, seed: str, size: int, avoid: list[str],
                   book: Sequence[str] | None, start: int | None = None) -> tuple[list[str], str]:
    """(the haystack of `size` units: a book's sentences from word `start` (None: a random sentence
    start), noise lines or distractor lines; what joins them), the needles not yet in it."""
    if task.haystack == "book":
        if book is None:
            raise ValueError(f"{task.name} needs the book haystack (corpora/books.py)")
        return sentences(book_stretch(book, stream(seed, "book"), size, start)), " "
    if task.haystack == "noise":
        return [NOISE] * size, "\n"
    filler = stream(seed, "distractors")  # needle: every line a distractor needle of another key
    kind = task.settings["type_needle_v"]
    values = DRAWS[kind]
    return [NEEDLE.format(kind=kind, key=key, value=values(filler))
            for key in distinct(filler, DRAWS[task.settings["type_needle_k"]], size, avoid)], "\n"


def _context(task: Task, seed: str, size: int, needles: list[str], avoid: list[str],
             book: Sequence[str] | None) -> str:
    """The haystack of `size` units (lines, or a book's words) with the needles in it."""
    place = stream(seed, "place")
    units, joiner = haystack_units(task, seed, size, avoid, book)
    if task.haystack == "book":  # between sentences at RULER's depths
        cuts = [0] + sorted(int(len(units) * depth / 100) for depth in place.sample(DEPTHS, len(needles))) + [len(units)]
        pieces = []
        for i in range(1, len(cuts)):
            pieces.append(" ".join(units[cuts[i - 1]:cuts[i]]))
            if i - 1 < len(needles):
                pieces.append(needles[i - 1])
        return " ".join(p for p in pieces if p)
    for index in sorted(place.sample(range(size), len(needles)), reverse=True):
        units.insert(index, needles.pop())
    return joiner.join(units)


def niah(task: Task, seed: str, size: int, book: Sequence[str] | None = None) -> Example:
    """One example of a needle task with `size` haystack units."""
    s = task.settings
    kind = s["type_needle_v"]
    draw = stream(seed, "needles")
    keys = distinct(draw, DRAWS[s["type_needle_k"]], max(s["num_needle_k"], s["num_needle_q"]))
    values = [distinct(draw, DRAWS[kind], s["num_needle_v"]) for _ in keys]
    needles = [NEEDLE.format(kind=kind, key=key, value=value) for key, vs in zip(keys, values) for value in vs]
    draw.shuffle(needles)
    asked = draw.sample(range(len(keys)), s["num_needle_q"])
    answers = tuple(value for i in asked for value in values[i])
    query = keys[asked[0]] if len(asked) == 1 else ", ".join(keys[i] for i in asked[:-1]) + ", and " + keys[asked[-1]]
    context = _context(task, seed, size, list(reversed(needles)), keys, book)
    template, prefix, noun = NIAH_TEMPLATE, NIAH_PREFIX, kind
    if len(answers) == 1:
        template, prefix, noun = _singular(template), _singular(prefix), kind[:-1]
    return Example(task.name, template.format(kind=noun, context=context, query=query),
                   prefix.format(kind=noun, query=query), answers, size)
