"""corpora/documents.py: every target of every document scored once, no window holding two documents,
and one document scored exactly as corpora/batching.py scores a stream."""
import numpy as np
import pytest

from corpora import eval_batches
from corpora.documents import document_batches


@pytest.mark.parametrize("length,stride", [(10, 10), (10, 3), (7, 7)])
def test_no_window_crosses_a_document_and_every_target_is_scored_once(length, stride):
    sizes = [23, 0, 5, 40]  # token values: 1000 * document + index, eos 0
    docs = [1000 * (d + 1) + np.arange(n, dtype=np.int32) for d, n in enumerate(sizes)]
    joined = np.concatenate(docs)
    seen = np.zeros(len(joined), int)
    for inputs, targets, weights, ids in document_batches(docs, length, stride, 3, eos_id=0):
        scored = weights > 0
        assert ((ids >= 0) == scored).all() and (joined[ids[scored]] == targets[scored]).all()
        np.add.at(seen, ids[scored], 1)
        for row in range(len(inputs)):
            if scored[row].any():  # one document per window, its first input the eos token
                doc = targets[row][scored[row]] // 1000
                assert (doc == doc[0]).all() and (targets[row][:scored[row].argmax() + 1] // 1000 == doc[0]).all()
                first = targets[row][0]
                assert inputs[row][0] == (0 if first % 1000 == 0 else first - 1)
    assert (seen == 1).all()


def test_one_document_gives_the_stream_s_windows():
    stream = np.arange(1, 50, dtype=np.int32)
    ours = list(document_batches([stream], 16, 5, 4, eos_id=0))
    theirs = list(eval_batches(stream, 16, 5, 4, eos_id=0))
    assert len(ours) == len(theirs)
    for (a, b, c, _), (x, y, z) in zip(ours, theirs):
        assert (a == x).all() and (b == y).all() and (c == z).all()
