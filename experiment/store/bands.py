"""What a perplexity record's loss by position band and by block are (experiment/evals/perplexity.py
fills them, experiment/report/bands.py reads them), for the question "is the text past the window
used?" (results/books_smollm2/).

- Position bands, relative to the window L the model was trained at (the record's train_length):
  before L, L to 2L, 2L to 4L, ... of the position inside the evaluation window, i.e. of how much
  context a token had. A method that uses far text lowers the loss of the far bands; one that only
  keeps perplexity flat does not.
- Blocks: the scored targets of each document cut into consecutive blocks of BLOCK tokens (the last
  one of a document shorter), each with its mean loss and the position (inside its evaluation
  window) of its first target, which gives its band. Every evaluation of the same tokens has the same
  blocks, so two methods pair block by block (experiment/report/bootstrap.py).
Nothing here imports JAX.
"""
from __future__ import annotations

import numpy as np

BLOCK = 512
MAX_BLOCKS = 16384  # more (an evaluation of over 8M tokens): no blocks recorded, the file stays small


def band_edges(eval_length: int, train_length: int) -> list[tuple[int, int]]:
    """[(first position, last position)] of the bands of a window of `eval_length`: [0, L), [L, 2L),
    [2L, 4L), ... (L = train_length), the last one cut at the window's end."""
    edges, low, high = [], 0, int(train_length)
    while low < eval_length:
        edges.append((low, min(high, eval_length) - 1))
        low, high = high, 2 * high
    return edges


def band_of(position: int, train_length: int) -> int:
    """The band index of a position: 0 before L, 1 for [L, 2L), 2 for [2L, 4L), ..."""
    return 0 if position < train_length else 1 + int(np.floor(np.log2(position / train_length)))


def band_label(first: int, last: int, train_length: int) -> str:
    """'< L', 'L-2L', '2L-4L', ... for a band's positions."""
    if first == 0:
        return "< L"
    k = first // train_length
    return f"{'' if k == 1 else k}L-{2 * k}L"


def bands(position_sum: np.ndarray, position_count: np.ndarray, train_length: int) -> list[list]:
    """[[first, last, tokens, mean loss]] per band with scored tokens, from per-position loss sums and
    counts (the evaluation window's positions)."""
    out = []
    for first, last in band_edges(len(position_sum), train_length):
        count = float(position_count[first:last + 1].sum())
        if count > 0:
            out.append([first, last, int(count), float(position_sum[first:last + 1].sum() / count)])
    return out


class Blocks:
    """Per-block loss sums of one evaluation, filled batch by batch (`add`), then `rows()`."""

    def __init__(self, document_lengths, block: int = BLOCK):
        lengths = np.asarray(list(document_lengths), dtype=np.int64)
        self.block = int(block)
        self.doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        per_doc = -(-lengths // self.block)
        self.doc_blocks = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
        self.count = int(per_doc.sum())
        self.enabled = self.count <= MAX_BLOCKS
        size = self.count if self.enabled else 0
        self.sums, self.tokens, self.first_position = np.zeros(size), np.zeros(size, np.int64), np.zeros(size, np.int64)

    def add(self, target_ids: np.ndarray, nll: np.ndarray) -> None:
        """`target_ids` (B x T: each scored target's index in the documents joined, -1 elsewhere) and the
        loss of each (B x T)."""
        if not self.enabled:
            return
        rows, cols = np.nonzero(target_ids >= 0)
        ids = target_ids[rows, cols]
        doc = np.searchsorted(self.doc_starts, ids, side="right") - 1
        local = ids - self.doc_starts[doc]
        block = self.doc_blocks[doc] + local // self.block
        np.add.at(self.sums, block, nll[rows, cols])
        np.add.at(self.tokens, block, 1)
        starts = local % self.block == 0
        self.first_position[block[starts]] = cols[starts]

    def rows(self) -> list[list] | None:
        """[[position of the first target, tokens, mean loss]] per block in document order (None where
        there are more than MAX_BLOCKS, or a block was left unscored)."""
        if not self.enabled or not self.count or (self.tokens == 0).any():
            return None
        means = self.sums / self.tokens
        return [[int(p), int(t), round(float(m), 6)] for p, t, m in zip(self.first_position, self.tokens, means)]
