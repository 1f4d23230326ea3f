"""RULER's variable tracking (scripts/data/synthetic/variable_tracking.py): a chain of assignments
"VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE ", ... (one chain, 4 hops: five names) hidden one
statement a line among the noise lines, in order; asked: every variable that holds the value.

Before the task, a solved one-shot example as RULER makes it: the same task with 3-letter names and
as much noise as fits in 500 tokens of the model's tokenizer, its names and value then redrawn.
"""
from __future__ import annotations

from corpora.ruler.haystacks import distinct, stream, variable
from corpora.ruler.prompt import Example, Prompter, RulerError, Shot, fit
from corpora.ruler.tasks import NOISE, VT_PREFIX, VT_TEMPLATE, Task

SHOT_TOKENS = 500  # RULER's budget for the one-shot example (its text with the answer prefix)


def _chain(seed: str, hops: int, letters: int) -> tuple[list[str], str, list[str]]:
    """(the statements, the value, the names in chain order)."""
    draw = stream(seed, "chain")
    names = distinct(draw, lambda rng: variable(rng, letters), hops + 1)
    value = str(draw.randint(10000, 99999))
    statements = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
    return statements, value, names


def _text(seed: str, size: int, hops: int, letters: int) -> tuple[str, str, list[str]]:
    statements, value, names = _chain(seed, hops, letters)
    lines = [NOISE] * size
    place = stream(seed, "place")
    for offset, (index, statement) in enumerate(zip(sorted(place.sample(range(size), len(statements))), statements)):
        lines.insert(index + offset, statement)
    context = "\n".join(lines).replace(". \n", ".\n")
    return VT_TEMPLATE.format(context=context, query=value), VT_PREFIX.format(count=hops + 1, query=value), names


def shot(seed: str, hops: int, encode) -> Shot:
    """The one-shot example: noise fitted to SHOT_TOKENS tokens (plain, no chat template; the least
    noise where even that passes them), then its names and value redrawn (RULER's randomize_icl)."""
    prompter = Prompter(encode)
    smallest = hops + 1  # a statement can only sit before a noise line

    def make(size):
        text, prefix, names = _text(seed + "/shot", size, hops, 3)
        return Example("vt", text, prefix, tuple(names), size)

    try:
        example, _ = fit(make, prompter, SHOT_TOKENS, 5, smallest=smallest)
    except RulerError:  # a tokenizer of near one token a character: the least noise there is
        example = make(smallest)
    text, prefix = example.text, example.answer_prefix
    draw = stream(seed, "shot names")
    _, value, _ = _chain(seed + "/shot", hops, 3)
    new_value = str(draw.randint(10000, 99999))
    answer = []
    for name in example.references:
        new = variable(draw, len(name))
        text, prefix = text.replace(name, new), prefix.replace(name, new)
        answer.append(new)
    return Shot(text.replace(value, new_value), prefix.replace(value, new_value), " ".join(answer), turn=False)


def vt(task: Task, seed: str, size: int, example_shot: Shot | None = None) -> Example:
    """One example with `size` noise lines (and `example_shot` before it, RULER's one-shot example)."""
    hops = task.settings["num_hops"]
    text, prefix, names = _text(seed, size, hops, 5)
    return Example(task.name, text, prefix, tuple(names), size, example_shot)
