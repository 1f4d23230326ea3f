"""A RULER example (what one task draws) and its prompt in a model's tokens, built to a target length.

`Example`: the task's text (instruction, context, question: RULER's template filled), the answer
prefix, the reference strings and, for vt and cwe, the one-shot example before it. `Prompter` makes
the prompt as RULER's templates do: 'base' (RULER's `base` template: the text, then the answer
prefix) or 'chat' (the model's own chat template: the text as the user's message, the one-shot
example as RULER places it, and the answer prefix after the assistant's turn begins).

`fit(make, prompter, budget)` finds the largest haystack whose prompt has at most `budget` tokens
(RULER's search for its haystack size, here per example, so that every example comes as close to
its length as the haystack's grain allows, not only the first).
"""
from __future__ import annotations

import dataclasses
from typing import Callable


class RulerError(ValueError):
    """A RULER example cannot be built as asked (a length too short for the task's fixed text)."""


@dataclasses.dataclass(frozen=True)
class Shot:
    """A solved example before the task: its text (instruction, context, question), its answer
    prefix and answer. `turn`: in a chat, a turn of its own (cwe: RULER repeats the whole template);
    else inside the user's message before the task (vt: RULER inserts it there)."""
    text: str
    answer_prefix: str
    answer: str
    turn: bool

    @property
    def solved(self) -> str:
        return self.text + self.answer_prefix + (" " if not self.answer_prefix.endswith(" ") else "") + self.answer


@dataclasses.dataclass(frozen=True)
class Example:
    """One example of a task: `text` and `answer_prefix` as RULER's template gives them, the
    `references` its answer must hold (scored as the fraction found), the one-shot example (`shot`)
    and how many haystack units (`size`: lines, words, list entries) its context holds."""
    task: str
    text: str
    answer_prefix: str
    references: tuple[str, ...]
    size: int
    shot: Shot | None = None


@dataclasses.dataclass(frozen=True)
class Prompter:
    """The prompt of an example in a model's tokens. `encode(text, special)`: ids of `text`, with the
    tokenizer's own special tokens where `special` (a plain prompt, as the model reads one); `chat`:
    messages -> the text of the model's chat template with its generation prompt (None: base only)."""
    encode: Callable[[str, bool], list[int]]
    chat: Callable[[list[dict]], str] | None = None
    template: str = "base"

    def __post_init__(self):
        if self.template not in ("base", "chat"):
            raise ValueError(f"a RULER prompt's template is 'base' or 'chat', got {self.template!r}")
        if self.template == "chat" and self.chat is None:
            raise ValueError("the 'chat' template needs the model's chat template")

    def text(self, example: Example) -> str:
        shot = example.shot
        if self.template == "base":
            before = shot.solved + "\n" if shot else ""
            return before + example.text + example.answer_prefix
        messages = []
        if shot and shot.turn:
            messages += [{"role": "user", "content": shot.text},
                         {"role": "assistant", "content": shot.solved[len(shot.text):].strip()}]
        user = (shot.solved + "\n" if shot and not shot.turn else "") + example.text
        return self.chat(messages + [{"role": "user", "content": user}]) + example.answer_prefix

    def ids(self, example: Example) -> list[int]:
        return list(self.encode(self.text(example), self.template == "base"))


def fit(make: Callable[[int], Example], prompter: Prompter, budget: int, guess: int, *,
        smallest: int = 1) -> tuple[Example, list[int]]:
    """(example, prompt ids) of the largest size >= `smallest` whose prompt has at most `budget`
    tokens, searched from `guess` (the size an earlier example of the same length took): steps up or
    down from it that double until one crosses the budget, then halving. A RulerError where even
    `smallest` does not fit."""
    tried: dict[int, tuple[Example, list[int]]] = {}

    def fits(size: int) -> bool:
        if size not in tried:
            example = make(size)
            tried[size] = (example, prompter.ids(example))
        return len(tried[size][1]) <= budget

    if not fits(smallest):
        raise RulerError(f"{tried[smallest][0].task}: {len(tried[smallest][1])} tokens of instruction, question and "
                         f"the least haystack already pass the {budget} the length leaves; evaluate a longer length")
    low, high = smallest, None  # low fits; high, once known, does not
    size, step = max(guess, smallest), max(1, guess // 256)
    if fits(size):
        low = size
        while high is None:
            if fits(low + step):
                low, step = low + step, step * 2
            else:
                high = low + step
    else:
        high = size
        while high - step > low:
            if fits(high - step):
                low = high - step
                break
            high, step = high - step, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return tried[low]
