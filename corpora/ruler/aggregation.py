"""RULER's aggregation tasks: common words extraction (cwe, scripts/data/synthetic/
common_words_extraction.py) and frequent words extraction (fwe, freq_words_extraction.py).

cwe: a numbered list of words, 10 of them 30 times each, every other one 3 times, shuffled; asked:
the 10 most common. Before it, RULER's solved one-shot example (40 words, 10 of them 10 times, the
rest 3 times). Below a 4,096-token length RULER makes both smaller (20 words 3 / 1 times; the task's
common words 6 times, the others once): so here.

fwe: "coded" words (random 6-letter strings; a vocabulary of one word per 50 tokens of the length)
drawn with Zipf frequencies (alpha 2: word k about n k^-2 / zeta(2) times), the most frequent one
written '...' (noise to ignore); asked: the three most frequent coded words (ranks 2-4).
"""
from __future__ import annotations

import string

from corpora.ruler.haystacks import stream
from corpora.ruler.prompt import Example, Shot
from corpora.ruler.tasks import CWE_PREFIX, CWE_TEMPLATE, FWE_PREFIX, FWE_TEMPLATE, Task
from corpora.ruler.words import vocabulary

SMALL = 4096  # below this length RULER's cwe lists are shorter and repeat less


def _numbered(words) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def _word_list(seed: str, purpose: str, count: int, common: int, common_repeats: int,
               other_repeats: int) -> tuple[str, list[str]]:
    """(the numbered list, its common words): `count` distinct words, the first `common` of them
    repeated `common_repeats` times, the rest `other_repeats` times, shuffled."""
    words = list(vocabulary())
    if count > len(words):
        raise ValueError(f"cwe: {count} distinct words asked, the vocabulary has {len(words)}: a shorter length")
    stream(seed, purpose + " words").shuffle(words)  # the same first words at every count
    chosen = words[:count]
    listed = chosen[:common] * common_repeats + chosen[common:] * other_repeats
    stream(seed, purpose + " order").shuffle(listed)
    return _numbered(listed), chosen[:common]


def cwe(task: Task, seed: str, size: int, length: int) -> Example:
    """One example of `size` distinct words at target length `length`."""
    s = task.settings
    common = s["num_cw"]
    if length < SMALL:
        (shot_list, shot_words), repeats = _word_list(seed, "shot", 20, common, 3, 1), (6, 1)
    else:
        (shot_list, shot_words), repeats = _word_list(seed, "shot", 40, common, 10, 3), (s["freq_cw"], s["freq_ucw"])
    context, answer = _word_list(seed, "task", size, common, *repeats)
    shot = Shot(CWE_TEMPLATE.format(context=shot_list), CWE_PREFIX, _numbered(shot_words), turn=True)
    return Example(task.name, CWE_TEMPLATE.format(context=context), CWE_PREFIX, tuple(answer), size, shot)


def zeta(alpha: float, terms: int = 1000) -> float:
    """Riemann's zeta(alpha), alpha > 1: the first `terms` terms and the Euler-Maclaurin tail."""
    head = sum(k ** -alpha for k in range(1, terms))
    n = float(terms)
    return head + n ** (1 - alpha) / (alpha - 1) + 0.5 * n ** -alpha + alpha * n ** (-alpha - 1) / 12


def fwe(task: Task, seed: str, size: int, length: int) -> Example:
    """One example of about `size` coded words at target length `length` (its vocabulary size)."""
    alpha = float(task.settings["alpha"])
    draw = stream(seed, "vocabulary")
    words: set[str] = set()
    vocabulary_size = max(4, (length - task.tokens_to_generate) // 50)
    while len(words) < vocabulary_size:
        words.add("".join(draw.choices(string.ascii_lowercase, k=6)))
    coded = sorted(words)
    draw.shuffle(coded)
    coded[0] = "..."  # the most frequent: noise
    norm = zeta(alpha)
    text = [w for k, w in enumerate(coded, start=1) for _ in range(int(size * k ** -alpha / norm))]
    stream(seed, "order").shuffle(text)
    return Example(task.name, FWE_TEMPLATE.format(context=" ".join(text)), FWE_PREFIX, tuple(coded[1:4]), size)

