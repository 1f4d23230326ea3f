"""Paired comparisons of methods scored on the same examples: is one method's score above another's
by more than chance?

RULER and passkey questions: each method answered the same questions, so a pair of methods is judged on
the questions where they disagree. Where every question is independent of the others (its own context),
the exact McNemar test: under "no difference" each discordant question goes either way with
probability 1/2, and the two-sided p-value is the binomial tail of the split seen. Where questions are
not independent, they are tested in groups: the k questions of one context (one prefill for them), and
contexts whose haystacks share text (stretches of the same books that overlap: `shared_text_groups`,
joined where they chain). The test is then the exact sign test over groups (each group's summed
difference counts once, for A or for B; McNemar over groups of one), and the interval of the difference
in mean score a bootstrap that resamples groups, the questions of a group kept together. A pair is
"separated" at 95% where p < 0.05. Nothing here imports JAX.

A table tests many pairs at once, and some of them pass at 95% by chance alone: its last column applies
Holm's step-down correction over the table's pairs (the smallest p against 0.05 / m, the next against
0.05 / (m - 1), and so on, stopping at the first that fails), so that a reader can tell the separations
that hold for the whole table ("kept") from those that hold for one pair alone.

    diff = paired(scores_a, scores_b, clusters)     # clusters: each question's group (None: its own)
    diff.separated, diff.estimate, diff.low, diff.high, diff.p
    groups = shared_text_groups(contexts, spans, haystack_words)   # a designed record's fields
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from experiment.report import bootstrap

LEVEL = 0.95  # bootstrap.py's level too
SAMPLES = 4000


@dataclasses.dataclass(frozen=True)
class Paired:
    """A - B over `count` paired questions in `clusters` groups: the difference of mean scores with
    its interval, the discordant questions (`a_only`: A right and B wrong; `b_only`), the groups whose
    summed difference favours each (`a_groups`, `b_groups`), and the test that decides (`test`:
    "mcnemar" over questions, or "sign" over groups of several questions; p-value `p`)."""
    estimate: float
    low: float
    high: float
    count: int
    clusters: int
    a_only: int
    b_only: int
    test: str
    p: float
    a_groups: int = 0
    b_groups: int = 0

    @property
    def separated(self) -> bool:
        return self.p < 1 - LEVEL


def mcnemar_p(a_only: int, b_only: int) -> float:
    """The exact two-sided McNemar p-value: twice the binomial(n, 1/2) tail of the smaller count (at
    most 1); 1 where no question is discordant."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2 * tail)


def holm(p_values: Sequence[float], level: float = LEVEL) -> list[bool]:
    """Holm's step-down test over `p_values` (one family): for each, whether it is rejected at the
    family-wise `level`. In ascending order the i-th smallest (from 0) is compared with
    (1 - level) / (m - i); the first that is not below its threshold and every larger one are kept."""
    order = np.argsort(np.asarray(p_values, np.float64), kind="stable")
    rejected = [False] * len(order)
    for rank, i in enumerate(order):
        if not p_values[i] < (1 - level) / (len(order) - rank):
            break
        rejected[i] = True
    return rejected


def holm_threshold(p_values: Sequence[float], index: int, level: float = LEVEL) -> float:
    """The threshold Holm's test compares `p_values[index]` with: (1 - level) / (m - its rank)."""
    order = list(np.argsort(np.asarray(p_values, np.float64), kind="stable"))
    return (1 - level) / (len(order) - order.index(index))


def cluster_bootstrap(values, clusters, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile interval of the mean of `values` over resamplings of their clusters (each
    drawn cluster brings all its questions): experiment/report/bootstrap.py's, every question weighing
    one."""
    ones = np.ones(len(values))
    d = bootstrap.paired_bootstrap(values, np.zeros(len(values)), ones, samples=SAMPLES, seed=seed, clusters=clusters)
    return d.low, d.high


def paired(scores_a: Sequence[float], scores_b: Sequence[float], clusters: Sequence[int] | None = None,
           seed: int = 0) -> Paired:
    """A - B on the same questions in the same order; `clusters`: each question's group (None or all
    distinct: McNemar on questions scored 0 or 1; else the sign test over groups, or over questions with
    partial scores), the interval a bootstrap over them."""
    a, b = np.asarray(scores_a, np.float64), np.asarray(scores_b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"a paired comparison needs both methods' scores on the same questions; got {a.shape} and "
                         f"{b.shape}")
    groups = np.arange(len(a)) if clusters is None else np.asarray(clusters)
    if groups.shape != a.shape:
        raise ValueError(f"clusters: one per question, got {groups.shape} for {a.shape}")
    diff = a - b
    a_only, b_only = int((a > b).sum()), int((b > a).sum())
    names, index = np.unique(groups, return_inverse=True)
    sums = np.bincount(index, weights=diff)
    a_groups, b_groups = int((sums > 1e-12).sum()), int((sums < -1e-12).sum())
    low, high = cluster_bootstrap(diff, groups, seed=seed)  # (beside the test: the size of the difference)
    binary = bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    mcnemar = len(names) == len(a) and binary  # independent questions scored 0 or 1
    return Paired(float(diff.mean()), low, high, len(a), len(names), a_only, b_only,
                  "mcnemar" if mcnemar else "sign", mcnemar_p(a_groups, b_groups), a_groups, b_groups)


def shared_text_groups(contexts: Sequence[int], spans: Sequence[Sequence[int]] | None = None,
                       haystack_words: int | None = None) -> np.ndarray:
    """Each question's group: its context, joined with every context whose haystack stretch ([first
    word, words] of a book of `haystack_words` words, wrapping round its end) shares a word with its
    own, and so on along the chain (the most cautious reading: prompts that share text move together).
    Without spans (RULER's noise or needle haystacks, or records from before they were kept) the groups
    are the contexts. Groups are numbered by their first question."""
    contexts = np.asarray(contexts)
    if spans is None or not len(spans):
        return _numbered(contexts.tolist())
    if len(spans) != len(contexts) or not haystack_words:
        raise ValueError(f"spans: one per question and the haystack's words; got {len(spans)} for {len(contexts)}")
    starts = {}
    for c, (start, words) in zip(contexts.tolist(), spans):
        starts.setdefault(c, (int(start), int(words)))
    keys = list(starts)
    parent = {c: c for c in keys}

    def root(c):
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c
    n = int(haystack_words)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            (sa, wa), (sb, wb) = starts[a], starts[b]
            gap = (sb - sa) % n  # b's start, counted from a's, round the book
            if gap < wa or n - gap < wb or wa + wb > n:
                parent[root(a)] = root(b)
    return _numbered([root(c) for c in contexts.tolist()])


def _numbered(labels: list) -> np.ndarray:
    """`labels` renumbered 0, 1, ... in the order each first appears."""
    order: dict = {}
    return np.asarray([order.setdefault(label, len(order)) for label in labels])


def pairs_table(columns: dict[str, Sequence[float]], clusters: Sequence[int] | None = None,
                heading: str = "method") -> str:
    """A markdown table of every pair of `columns` ({method: its scores on the same questions}): the
    difference of the first minus the second, its interval, the discordant counts, the test, "separated"
    or "not separated" at 95%, and whether a separation holds after Holm's correction over the table's
    pairs (`holm`). A column with fewer questions (a cell asked again with more: its first questions are
    the same) is compared on the questions both have, and the test says so; `clusters` (each question's
    group) are the longest column's."""
    names = list(columns)
    rows = []
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            n = min(len(columns[first]), len(columns[second]))
            d = paired(columns[first][:n], columns[second][:n], None if clusters is None else clusters[:n])
            rows.append((first, second, n, d))
    p_values = [d.p for *_, d in rows]
    kept = holm(p_values)
    lines = [f"| {heading} A | {heading} B | A - B (points) [95%] | A only / B only | test | at 95% | "
             f"Holm, {len(rows)} pairs |", "|---|---|---|---|---|---|---|"]
    for k, (first, second, n, d) in enumerate(rows):
        if d.test == "mcnemar":
            test = f"McNemar p = {d.p:.3g}"
        else:
            unit = "groups" if d.clusters < d.count else "questions"
            test = f"sign test over {d.clusters} {unit}, {d.a_groups} / {d.b_groups}: p = {d.p:.3g}"
        if n < max(len(columns[first]), len(columns[second])):
            test += f", the first {n} questions"
        if not d.separated:
            corrected = ""
        elif kept[k]:
            corrected = "kept"
        else:
            corrected = f"not kept (threshold {holm_threshold(p_values, k):.2g})"
        lines.append(f"| {first} | {second} | {100 * d.estimate:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] | "
                     f"{d.a_only} / {d.b_only} | {test} | {'**separated**' if d.separated else 'not separated'} | "
                     f"{corrected} |")
    return "\n".join(lines) + "\n"
