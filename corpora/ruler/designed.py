"""RULER's needle tasks with the needles placed by design: each asked needle at a chosen distance from
the prompt's end (in the model's tokens), and k needles of distinct keys in one context, each asked in a
question of its own (k prompts that share the context: one prefill serves them, models/generate.py's
`generate_shared`).

RULER draws a needle's depth at random (corpora/ruler/niah.py, RULER's 40 depths), so that at twice a
model's window about half its needles lie inside the window. Here context j of a cell holds its asked
needles at distances `targets[(j * k + q) % len(targets)]`, q < k (every distance asked equally often,
no two needles of a context at the same distance); the task's other needles (niah_multikey_1's
distractor keys) and its haystack stay RULER's. A needle is put between haystack units (lines, or a
book's sentences), so its distance lands within a unit's tokens of the target: each question's
prompt is measured (`corpora.ruler.needle_distances`) and the placement moved until it lies within 1.5
units' tokens (`Context.grain`; a line or a sentence: ~20-40 of a real model's tokens), or as near as
the haystack's boundaries allow (a long sentence; the nearest of ROUNDS placements is kept).

    contexts = designed.build("niah_single_2", 16384, contexts=12, seed=42, prompter=p,
                              targets=[12288, 14336], questions=4)
    contexts[0].examples[q].ids        # question q's prompt; contexts[0].distances[q]: its needle's
    contexts[0].span                   # a book haystack's (first word, words): contexts can share text
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from corpora.ruler import haystacks, niah
from corpora.ruler.haystacks import DRAWS, distinct, stream
from corpora.ruler.prompt import Example, Prompter, RulerError, fit
from corpora.ruler.tasks import NEEDLE, NIAH_PREFIX, NIAH_TEMPLATE, Task, task

ROUNDS = 8  # placements tried per context before giving up on a target


@dataclasses.dataclass(frozen=True)
class Context:
    """One context and its k questions: `examples[q]` (a `corpora.ruler.Built`) asks for the value of
    needle q, at `distances[q]` tokens from its prompt's end (asked: `targets[q]`)."""
    examples: list
    targets: list[int]
    distances: list[int]
    grain: float  # the haystack's tokens per unit (line or sentence): how near a target a needle can sit
    span: tuple[int, int] | None = None  # a book haystack's (first word, words) in the book's words
    haystack_words: int | None = None  # how many words the book holds (a stretch wraps round its end)


def supports(name: str) -> bool:
    """Whether task `name` can be placed by design: a needle task asking one key's one value."""
    s = task(name).settings
    return task(name).family == "niah" and s["num_needle_v"] == 1 and s["num_needle_q"] == 1


DESIGNED_TASKS = tuple(n for n in ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
                                   "niah_multikey_2", "niah_multikey_3") if supports(n))


def _examples(t: Task, seed: str, size: int, at: list[float], questions: int,
              book: Sequence[str] | None, start: int | None = None) -> tuple[list[Example], int]:
    """(the k questions of one context of `size` haystack units, how many units it holds): asked needle
    q sits before the unit at fraction `at[q]` of the units (clipped to [0, 1])."""
    s = t.settings
    kind = s["type_needle_v"]
    draw = stream(seed, "needles")
    keys = distinct(draw, DRAWS[s["type_needle_k"]], max(s["num_needle_k"], questions))
    values = [distinct(draw, DRAWS[kind], 1)[0] for _ in keys]
    needles = [NEEDLE.format(kind=kind, key=key, value=value) for key, value in zip(keys, values)]
    units, joiner = niah.haystack_units(t, seed, size, keys, book, start)
    count = len(units)
    place = stream(seed, "place")
    spots = [int(round(min(1.0, max(0.0, a)) * count)) for a in at]
    spots += [place.randrange(count + 1) for _ in needles[questions:]]  # distractors: anywhere
    for index, needle in sorted(zip(spots, needles), key=lambda p: p[0], reverse=True):
        units.insert(index, needle)
    context = joiner.join(units)
    template, prefix = niah._singular(NIAH_TEMPLATE), niah._singular(NIAH_PREFIX)
    noun = kind[:-1]
    return [Example(t.name, template.format(kind=noun, context=context, query=keys[q]),
                    prefix.format(kind=noun, query=keys[q]), (values[q],), size) for q in range(questions)], count


def build(name: str, length: int, contexts: int, seed: int, prompter: Prompter, targets: Sequence[int],
          questions: int = 1, book: Sequence[str] | None = None, disjoint: bool = False) -> list[Context]:
    """`contexts` contexts of task `name` for target length `length` (RULER's: the prompt and the
    answer budget), each with `questions` asked needles at designed distances from `targets` (tokens
    from the prompt's end). Context j of a (task, length, seed, targets, questions, disjoint) is the
    same whatever else is asked. A book haystack's stretch starts at a random sentence, or with
    `disjoint` in a slot of its own (haystacks.disjoint_starts: no two contexts share text, up to as
    many contexts as the books have slots for; those past that start at random)."""
    from corpora.ruler import Built, needle_distances
    if not supports(name):
        raise RulerError(f"{name}: needles by distance take the tasks asking one key's value: "
                         f"{', '.join(DESIGNED_TASKS)}")
    targets = [int(d) for d in targets]
    if questions < 1 or questions > len(targets):
        raise RulerError(f"{questions} questions per context need as many distinct distances; got {len(targets)} "
                         f"({targets}): give more --needle_distances or fewer --questions_per_prefill")
    t = task(name)
    if t.book and book is None:
        book = haystacks.book_words()
    budget = length - t.tokens_to_generate - 16  # room for the questions' keys, which differ in tokens
    far = max(targets)
    if budget < far + 64 or min(targets) < 32:
        raise RulerError(f"{name} at {length}: a needle distance must lie in [32, {budget - 64}] tokens from the "
                         f"prompt's end (asked {min(targets)}..{far}); choose --needle_distances within the length")
    out, guess = [], max(1, budget // 32)
    starts: list[int] = []
    if disjoint and t.book:  # the slots' width from the words the first context takes at its random start
        first, _ = fit(lambda size: _examples(t, f"{seed}/{name}/{length}/designed/{questions}/0", size,
                                              [0.5] * questions, questions, book)[0][0],
                       prompter, budget, guess, smallest=questions + 1)
        starts = haystacks.disjoint_starts(book, first.size, f"{seed}/{name}/{length}/designed/{questions}")
    for j in range(contexts):
        seed_j = f"{seed}/{name}/{length}/designed/{questions}/{j}"
        wanted = [targets[(j * questions + q) % len(targets)] for q in range(questions)]
        fraction = [1 - d / budget for d in wanted]
        start = starts[j] if j < len(starts) else None

        def make(size, fraction=fraction, seed_j=seed_j, start=start):
            return _examples(t, seed_j, size, fraction, questions, book, start)[0][0]
        first, _ = fit(make, prompter, budget, guess, smallest=questions + 1)
        size = guess = first.size
        at = list(fraction)
        best = None  # (largest error, built, got, grain) of the nearest placement tried
        for _ in range(ROUNDS):
            examples, units = _examples(t, seed_j, size, at, questions, book, start)
            built = [Built(e, prompter.ids(e)) for e in examples]
            got = [needle_distances(b, prompter)[0] for b in built]
            tokens = len(built[0].ids)
            grain = tokens / units
            error = max(abs(g - w) for g, w in zip(got, wanted))
            if best is None or error < best[0]:
                best = (error, built, got, grain)
            if error <= max(1.5 * grain, 8):
                break
            at = [a + (g - w) / tokens for a, g, w in zip(at, got, wanted)]  # later in the text: nearer the end
        error, built, got, grain = best  # a long sentence can keep a needle farther than that from its target
        if error > max(0.05 * length, 4 * grain):
            raise RulerError(f"{name} at {length}: needles at {wanted} tokens from the end could not be placed "
                             f"(got {got}); choose distances farther from the prompt's ends")
        if max(len(b.ids) for b in built) > length - t.tokens_to_generate:
            raise RulerError(f"{name} at {length}: a question's prompt passed the length's budget")
        span = haystacks.book_span(book, stream(seed_j, "book"), size, start) if t.book else None
        out.append(Context(built, wanted, got, grain, span, len(book) if span else None))
    return out
