"""Paired comparisons of methods scored on the same examples: is one method's score above another's
by more than chance?

RULER and passkey questions: each method answered the same questions, so a pair of methods is judged on
the questions where they disagree. Where every question has its own context (one question a prefill),
the exact McNemar test: under "no difference" each discordant question goes either way with
probability 1/2, and the two-sided p-value is the binomial tail of the split seen. Where a context holds
k questions (one prefill for them), its questions are not independent: the interval of the difference
in mean score is a bootstrap that resamples contexts (clusters), the questions of a context kept
together. A pair is "separated" at 95% where p < 0.05 (McNemar) or the interval leaves out 0
(clusters). Nothing here imports JAX.

    diff = paired(scores_a, scores_b, clusters)     # clusters: each question's context (None: its own)
    diff.separated, diff.text()
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

LEVEL = 0.95
SAMPLES = 4000


@dataclasses.dataclass(frozen=True)
class Paired:
    """A - B over `count` paired questions in `clusters` contexts: the difference of mean scores with
    its interval, the discordant questions (`a_only`: A right and B wrong; `b_only`), and the test
    that decides (`test`: "mcnemar" with `p`, or "cluster bootstrap")."""
    estimate: float
    low: float
    high: float
    count: int
    clusters: int
    a_only: int
    b_only: int
    test: str
    p: float | None

    @property
    def separated(self) -> bool:
        if self.test == "mcnemar":
            return self.p is not None and self.p < 1 - LEVEL
        return self.low > 0 or self.high < 0

    def text(self) -> str:
        """'+12.5 points [+4.2, +20.8], 9 vs 3 discordant, p = 0.15' and the like."""
        core = f"{100 * self.estimate:+.1f} points [{100 * self.low:+.1f}, {100 * self.high:+.1f}]"
        disc = f"{self.a_only} vs {self.b_only} discordant"
        test = f"McNemar p = {self.p:.3g}" if self.test == "mcnemar" else f"bootstrap over {self.clusters} contexts"
        return f"{core}, {disc}, {test}"


def mcnemar_p(a_only: int, b_only: int) -> float:
    """The exact two-sided McNemar p-value: twice the binomial(n, 1/2) tail of the smaller count (at
    most 1); 1 where no question is discordant."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2 * tail)


def cluster_bootstrap(diff: np.ndarray, clusters: np.ndarray, samples: int = SAMPLES, seed: int = 0,
                      level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of the mean of `diff` over resamplings of its clusters (each drawn
    cluster brings all its questions; the mean is over the questions drawn)."""
    ids, inverse = np.unique(clusters, return_inverse=True)
    sums = np.bincount(inverse, weights=diff, minlength=len(ids))
    sizes = np.bincount(inverse, minlength=len(ids)).astype(np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ids), size=(samples, len(ids)))
    means = sums[picks].sum(axis=1) / sizes[picks].sum(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def paired(scores_a: Sequence[float], scores_b: Sequence[float], clusters: Sequence[int] | None = None,
           seed: int = 0) -> Paired:
    """A - B on the same questions in the same order; `clusters`: each question's context (None or
    all distinct: McNemar on questions scored 0 or 1; else the cluster bootstrap)."""
    a, b = np.asarray(scores_a, np.float64), np.asarray(scores_b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"a paired comparison needs both methods' scores on the same questions; got {a.shape} and "
                         f"{b.shape}")
    groups = np.arange(len(a)) if clusters is None else np.asarray(clusters)
    if groups.shape != a.shape:
        raise ValueError(f"clusters: one per question, got {groups.shape} for {a.shape}")
    diff = a - b
    a_only, b_only = int(((a > b)).sum()), int(((b > a)).sum())
    independent = len(np.unique(groups)) == len(a)
    binary = bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    if independent and binary:
        low, high = cluster_bootstrap(diff, groups, seed=seed)  # shown beside McNemar's p, which decides
        return Paired(float(diff.mean()), low, high, len(a), len(a), a_only, b_only, "mcnemar",
                      mcnemar_p(a_only, b_only))
    low, high = cluster_bootstrap(diff, groups, seed=seed)
    return Paired(float(diff.mean()), low, high, len(a), int(len(np.unique(groups))), a_only, b_only,
                  "cluster bootstrap", None)


def pairs_table(columns: dict[str, Sequence[float]], clusters: Sequence[int] | None = None,
                heading: str = "method") -> str:
    """A markdown table of every pair of `columns` ({method: its scores on the same questions}): the
    difference of the first minus the second, its interval, the discordant counts, the test, and
    "separated" or "not separated" at 95%."""
    names = list(columns)
    lines = [f"| {heading} A | {heading} B | A - B (points) [95%] | A only / B only | test | at 95% |",
             "|---|---|---|---|---|---|"]
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            d = paired(columns[first], columns[second], clusters)
            test = f"McNemar p = {d.p:.3g}" if d.test == "mcnemar" else f"bootstrap, {d.clusters} contexts"
            lines.append(f"| {first} | {second} | {100 * d.estimate:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] | "
                         f"{d.a_only} / {d.b_only} | {test} | {'**separated**' if d.separated else 'not separated'} |")
    return "\n".join(lines) + "\n"
