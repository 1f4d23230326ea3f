"""A paired bootstrap over blocks of tokens: how much one evaluation's loss differs from another's on
the same tokens, with an interval that says whether the difference is more than the text's own
variation (experiment/store/bands.py: each evaluation's blocks).

Each block is a pair (loss under method A, loss under method B, its tokens). The estimate is the
token-weighted mean of A - B (nats per token; exp of it is the ratio of the two perplexities); the
interval is the percentile interval of that mean over `samples` resamplings of the blocks with
replacement, the pairs kept together: differences that every block shares are certain however
noisy the loss is, which an interval of each method's perplexity alone would not show. Blocks are
taken as independent (neighbouring blocks of one book are not quite), so the interval is if anything
too narrow. Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses

import numpy as np

SAMPLES = 2000
LEVEL = 0.95
CHUNK = 250  # resamplings drawn at a time (memory: CHUNK x blocks)


@dataclasses.dataclass(frozen=True)
class Difference:
    """A - B in nats per token (`estimate`) with its bootstrap interval (`low`, `high`) over `blocks`
    blocks of `tokens` tokens in all."""
    estimate: float
    low: float
    high: float
    blocks: int
    tokens: int

    @property
    def ratio(self) -> tuple[float, float, float]:
        """(estimate, low, high) as perplexity ratios A / B."""
        return float(np.exp(self.estimate)), float(np.exp(self.low)), float(np.exp(self.high))

    @property
    def certain(self) -> bool:
        """The interval leaves out 0: A and B differ on these tokens."""
        return self.low > 0 or self.high < 0


def windows_of(first_positions) -> np.ndarray:
    """Each block's evaluation window (0, 1, ...): a new window begins where a block's first position
    is not after the one before (every window starts at position 0; a document is one window or more)."""
    first = np.asarray(first_positions)
    return np.concatenate([[0], np.cumsum(first[1:] <= first[:-1])]).astype(np.int64) if len(first) else first


def paired_bootstrap(loss_a, loss_b, tokens, samples: int = SAMPLES, seed: int = 0,
                     level: float = LEVEL, clusters=None) -> Difference:
    """The token-weighted mean of loss_a - loss_b over blocks (each array one value per block, the
    same blocks in the same order) with its `level` percentile interval over `samples` resamplings of
    the blocks (draws from `seed`: the same numbers give the same interval). `clusters`: each block's
    cluster (its document or window); the clusters are resampled, each bringing all its blocks (the
    interval of a text whose neighbouring blocks are not independent)."""
    if clusters is not None:
        return _cluster_bootstrap(loss_a, loss_b, tokens, clusters, samples, seed, level)
    a, b, w = (np.asarray(x, dtype=np.float64) for x in (loss_a, loss_b, tokens))
    if not (a.shape == b.shape == w.shape) or a.ndim != 1 or not len(a):
        raise ValueError(f"paired_bootstrap needs one loss of each method and a token count per block, the same "
                         f"blocks; got {a.shape}, {b.shape} and {w.shape}")
    if not 0 < level < 1 or samples < 1:
        raise ValueError(f"level must be in (0, 1) and samples >= 1, got {level} and {samples}")
    diff = (a - b) * w
    estimate = float(diff.sum() / w.sum())
    rng = np.random.default_rng(seed)
    draws = []
    for lo in range(0, samples, CHUNK):
        picks = rng.integers(0, len(a), size=(min(CHUNK, samples - lo), len(a)))
        draws.append(diff[picks].sum(axis=1) / w[picks].sum(axis=1))
    draws = np.concatenate(draws)
    tail = (1 - level) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return Difference(estimate, float(low), float(high), int(len(a)), int(w.sum()))


def percent(difference: Difference) -> str:
    """'+1.2% [+0.8, +1.6]': the perplexity of A against B's, with the interval, in per cent."""
    mid, low, high = (100 * (r - 1) for r in difference.ratio)
    return f"{mid:+.1f}% [{low:+.1f}, {high:+.1f}]"


def _cluster_bootstrap(loss_a, loss_b, tokens, clusters, samples: int, seed: int, level: float) -> Difference:
    a, b, w = (np.asarray(x, dtype=np.float64) for x in (loss_a, loss_b, tokens))
    groups = np.asarray(clusters)
    if not (a.shape == b.shape == w.shape == groups.shape) or a.ndim != 1 or not len(a):
        raise ValueError(f"paired_bootstrap needs a loss of each method, a token count and a cluster per block; got "
                         f"{a.shape}, {b.shape}, {w.shape} and {groups.shape}")
    ids, inverse = np.unique(groups, return_inverse=True)
    diff = np.bincount(inverse, weights=(a - b) * w, minlength=len(ids))
    weight = np.bincount(inverse, weights=w, minlength=len(ids))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ids), size=(samples, len(ids)))
    draws = diff[picks].sum(axis=1) / weight[picks].sum(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return Difference(float(diff.sum() / weight.sum()), float(low), float(high), int(len(a)), int(w.sum()))


def per_cluster(loss_a, loss_b, tokens, clusters) -> list[float]:
    """The token-weighted mean of loss_a - loss_b within each cluster, in the clusters' order."""
    a, b, w, groups = (np.asarray(x) for x in (loss_a, loss_b, tokens, clusters))
    return [float(((a - b) * w)[groups == g].sum() / w[groups == g].sum()) for g in dict.fromkeys(groups.tolist())]
