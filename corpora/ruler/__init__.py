"""RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?"), offline: its synthetic tasks built to a target length in a model's own tokens, and its
score. Written from NVIDIA/RULER's scripts/data/synthetic/ (settings of scripts/synthetic.yaml,
templates of constants.py) and lm-evaluation-harness's `ruler` tasks; no code of theirs.

    from corpora import ruler
    prompter = ruler.Prompter(lambda text, special: tokenizer.encode(text, add_special_tokens=special).ids)
    examples = ruler.build("niah_single_1", 4096, samples=20, seed=42, prompter=prompter)
    ids = examples[0].ids                      # at most 4096 - 128 tokens (RULER's answer budget)
    ruler.score(generated_text, examples[0].example.references)   # the fraction of references found

Tasks (tasks.py: TASKS): niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, niah_multiquery
(niah.py), vt (vt.py), cwe and fwe (aggregation.py). RULER's essay haystack is a stretch of one of
two of the public-domain books of corpora/books.py here (the novels: haystacks.py; tasks
marked "book haystack"). A prompt of
length L (RULER's max_seq_length) holds at most L - tokens_to_generate tokens and, where the
haystack's grain allows (it does at RULER's lengths), at least 98% of that. Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from corpora.ruler import aggregation, haystacks, niah, vt
from corpora.ruler.prompt import Example, Prompter, RulerError, Shot, fit
from corpora.ruler.tasks import CORE, DEFAULT, TASKS, Task, task

__all__ = ["CORE", "DEFAULT", "TASKS", "Built", "Example", "Prompter", "RulerError", "Shot", "Task", "build",
           "needle_distances", "score", "task"]

_CONTROL = re.compile(r"[\x00-\x1f]")


@dataclasses.dataclass(frozen=True)
class Built:
    """An example and its prompt's token ids."""
    example: Example
    ids: list[int]


def _maker(t: Task, seed: str, length: int, prompter: Prompter, book: Sequence[str] | None):
    """(size -> the example with that much haystack, the least size the task takes)."""
    s = t.settings
    if t.family == "niah":
        if t.book and book is None:
            book = haystacks.book_words()
        needles = max(s["num_needle_k"], s["num_needle_q"]) * s["num_needle_v"]
        return (lambda size: niah.niah(t, seed, size, book)), needles
    if t.family == "vt":
        shot = vt.shot(seed, s["num_hops"], prompter.encode)
        return (lambda size: vt.vt(t, seed, size, shot)), s["num_hops"] + 1
    if t.family == "cwe":
        return (lambda size: aggregation.cwe(t, seed, size, length)), s["num_cw"] + 1
    return (lambda size: aggregation.fwe(t, seed, size, length)), 1


def build(name: str, length: int, samples: int, seed: int, prompter: Prompter,
          book: Sequence[str] | None = None) -> list[Built]:
    """`samples` examples of task `name` for target length `length` (the prompt and RULER's answer
    budget), each example's haystack as large as the length allows. Example i of a (task, length,
    seed) is the same whatever else is asked. `book`: the words of the book haystack (None: the four
    books of corpora/books.py)."""
    t = task(name)
    budget = length - t.tokens_to_generate
    if budget < 1:
        raise RulerError(f"{name}: a length of {length} leaves no room beside the {t.tokens_to_generate} tokens of "
                         f"its answer; evaluate a longer length")
    out, guess = [], max(1, budget // 32)
    for index in range(samples):
        example_seed = f"{seed}/{name}/{length}/{index}"
        make, smallest = _maker(t, example_seed, length, prompter, book)
        example, ids = fit(make, prompter, budget, guess, smallest=smallest)
        out.append(Built(example, ids))
        guess = example.size
    return out


def needle_distances(built: Built, prompter: Prompter) -> list[int]:
    """For each reference of a needle task's example: how many of the prompt's tokens lie from its
    needle's value to the prompt's end (the value's first occurrence in the prompt, counted as the
    tokens of the text before it; a tokenizer that merges across that boundary can move it by a
    token). A reference farther back than a method's window is one that method must reach past the
    window to find (experiment/study/needles.py)."""
    if task(built.example.task).family != "niah":
        raise RulerError(f"{built.example.task}: only the needle tasks hold each reference in one place")
    text = prompter.text(built.example)
    special = prompter.template == "base"
    out = []
    for reference in built.example.references:
        cut = text.find(reference)
        if cut < 0:
            raise RulerError(f"{built.example.task}: the reference {reference!r} is not in its prompt")
        out.append(len(built.ids) - len(prompter.encode(text[:cut], special)))
    return out


def score(prediction: str, references: Sequence[str]) -> float:
    """RULER's string_match_all: the fraction of `references` found in the prediction (case
    ignored; the prediction stripped, control characters read as line breaks)."""
    text = _CONTROL.sub("\n", prediction.strip()).strip().lower()
    return sum(ref.lower() in text for ref in references) / len(references)
