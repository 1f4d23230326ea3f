"""The evaluation protocol over several documents (corpora/books.py's books): each document scored as
corpora/batching.py scores one stream (nonoverlapping blocks or a sliding window, every target once,
its first input the end-of-line token), and no window holds tokens of two documents, so every token's
context is its own document's text. One document gives exactly `eval_batches`' windows.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from corpora.batching import EvalWindows


def document_windows(lengths: Sequence[int], length: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, first_scored) of every window, in the coordinates of the documents' targets joined
    end to end (document d's targets at offset sum(lengths[:d])); documents in order."""
    starts, ends, firsts, offset = [], [], [], 0
    for n in lengths:
        if n > 0:
            windows = EvalWindows(int(n), length, stride)
            start, end, first = windows.bounds(np.arange(len(windows)))
            starts.append(start + offset), ends.append(end + offset), firsts.append(first + offset)
        offset += int(n)
    if not starts:
        raise ValueError("no document has a token to score")
    return np.concatenate(starts), np.concatenate(ends), np.concatenate(firsts)


def document_batches(documents: Sequence[np.ndarray], length: int, stride: int, batch_size: int, eos_id: int
                     ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Yields (inputs, targets, weights, target_ids), each batch_size x length: weights 1 for scored
    targets, 0 for context and padding; target_ids each scored target's index in the documents'
    targets joined end to end (-1 elsewhere). The last batch is padded with all-zero-weight rows."""
    documents = [np.asarray(d, dtype=np.int32) for d in documents]
    targets_all = np.concatenate(documents) if documents else np.zeros(0, np.int32)
    inputs_all = np.concatenate([np.concatenate([[eos_id], d[:-1]]) for d in documents if len(d)]).astype(np.int32)
    start, end, first = document_windows([len(d) for d in documents], length, stride)
    # the input array skips empty documents, as the windows do: its index is the targets' index
    offsets = np.arange(length)
    for lo in range(0, len(start), batch_size):
        w = np.arange(lo, lo + batch_size)
        valid_row = w < len(start)
        w = np.minimum(w, len(start) - 1)
        idx = start[w][:, None] + offsets
        in_window = idx < end[w][:, None]
        idx = np.where(in_window, idx, 0)
        scored = in_window & (idx >= first[w][:, None]) & valid_row[:, None]
        yield (inputs_all[idx], targets_all[idx], scored.astype(np.float32), np.where(scored, idx, -1))
