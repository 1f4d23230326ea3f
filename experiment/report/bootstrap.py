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


def paired_bootstrap(loss_a, loss_b, tokens, samples: int = SAMPLES, seed: int = 0,
                     level: float = LEVEL) -> Difference:
    """The token-weighted mean of loss_a - loss_b over blocks (each array one value per block, the
    same blocks in the same order) with its `level` percentile interval over `samples` resamplings of
    the blocks (draws from `seed`: the same numbers give the same interval)."""
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
