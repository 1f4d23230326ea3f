"""Training windows and the evaluation protocol's windows over one flat token stream.

Evaluation scores every token of the stream exactly once. The input for the first token is the
end-of-line token (the stream is as if preceded by an empty line), as fairseq does, so a split of
N tokens has N targets (WikiText-103 valid: 217,646).
- nonoverlapping (stride = L): consecutive blocks of L targets; the last block may be shorter.
- sliding window (stride S < L): windows of L tokens ending at L, L+S, L+2S, ...; the first window
  scores all its targets, every later one only its last S (fewer at the very end).
Every window is encoded from position 0.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import numpy as np


def train_batch(stream: np.ndarray, step: int, batch_size: int, seq_len: int, seed: int,
                rows: slice = slice(None)):
    """Random windows of seq_len + 1 tokens, a deterministic function of (seed, step), so a resumed
    run sees exactly the batches an uninterrupted one would. Returns (inputs, targets), B x L each;
    with `rows`, only those rows of the batch (one host's share of a global batch)."""
    if len(stream) < seq_len + 2:
        raise ValueError(f"the training split has {len(stream)} tokens, too few for train.seq_len={seq_len}")
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - seq_len, size=batch_size)[rows]
    windows = stream[starts[:, None] + np.arange(seq_len + 1)]
    return windows[:, :-1], windows[:, 1:]


@dataclasses.dataclass(frozen=True)
class EvalWindows:
    """The windows of one (L_valid, stride) evaluation of a stream of `num_targets` tokens."""
    num_targets: int
    length: int
    stride: int

    def __post_init__(self):
        if self.length < 1 or not 1 <= self.stride <= self.length:
            raise ValueError(f"need 1 <= stride <= length, got stride={self.stride}, length={self.length}")

    def __len__(self) -> int:
        n, l, s = self.num_targets, self.length, self.stride
        if n <= l:
            return 1
        return 1 + math.ceil((n - l) / s)

    def bounds(self, w: np.ndarray):
        """(start, end, first_scored) in target coordinates for window indices `w`."""
        n, l, s = self.num_targets, self.length, self.stride
        end = np.minimum(l + w * s, n)
        start = np.maximum(end - l, 0)
        first = np.where(w == 0, 0, np.minimum(l + (w - 1) * s, n))
        return start, end, first


def eval_batches(stream: np.ndarray, length: int, stride: int, batch_size: int, eos_id: int
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yields (inputs, targets, weights), each batch_size x length; weights are 1 for scored
    targets, 0 for context and padding. The last batch is padded with all-zero-weight rows."""
    windows = EvalWindows(len(stream), length, stride)
    inputs_stream = np.concatenate([[eos_id], stream[:-1]]).astype(np.int32)
    offsets = np.arange(length)
    for first_w in range(0, len(windows), batch_size):
        w = np.arange(first_w, first_w + batch_size)
        valid_row = w < len(windows)
        start, end, first = windows.bounds(np.minimum(w, len(windows) - 1))
        idx = start[:, None] + offsets
        in_window = idx < end[:, None]
        idx = np.where(in_window, idx, 0)
        weights = (in_window & (idx >= first[:, None]) & valid_row[:, None]).astype(np.float32)
        yield inputs_stream[idx], stream[idx].astype(np.int32), weights
