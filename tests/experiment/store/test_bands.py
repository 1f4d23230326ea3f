"""experiment/store/bands.py: bands of positions relative to the window L, blocks of the documents'
targets (the same blocks however the tokens are batched into windows)."""
import numpy as np

from corpora.documents import document_batches
from experiment.store import bands


def test_bands_double_from_the_training_length():
    assert bands.band_edges(32768, 8192) == [(0, 8191), (8192, 16383), (16384, 32767)]
    assert bands.band_edges(12000, 8192) == [(0, 8191), (8192, 11999)]
    assert bands.band_edges(100, 8192) == [(0, 99)]
    assert [bands.band_of(p, 64) for p in (0, 63, 64, 127, 128, 255, 256)] == [0, 0, 1, 1, 2, 2, 3]
    assert [bands.band_label(a, b, 64) for a, b in bands.band_edges(512, 64)] == ["< L", "L-2L", "2L-4L", "4L-8L"]
    loss, count = np.arange(256.0), np.ones(256)
    assert bands.bands(loss, count, 64) == [[0, 63, 64, 31.5], [64, 127, 64, 95.5], [128, 255, 128, 191.5]]


def test_blocks_are_the_documents_tokens_whatever_the_window():
    """The loss of a token is its value here: a block's mean is the mean of its tokens, its first
    position where the window put its first token, the same blocks at every window length."""
    docs = [np.arange(1, 1200, dtype=np.int32), np.arange(1, 300, dtype=np.int32)]
    got = {}
    for length in (256, 1024):
        blocks = bands.Blocks([len(d) for d in docs], block=100)
        for _, targets, weights, ids in document_batches(docs, length, length, 2, eos_id=0):
            blocks.add(ids, targets.astype(float) * weights)
        got[length] = blocks.rows()
    for length, rows in got.items():
        assert [t for _, t, _ in rows] == [100] * 11 + [99] + [100, 100, 99]
        assert rows[0][2] == 50.5 and rows[11][2] == np.mean(np.arange(1101, 1200)) and rows[12][2] == 50.5
        assert [p for p, _, _ in rows][:4] == [(100 * i) % length for i in range(4)]
    assert [r[1:] for r in got[256]] == [r[1:] for r in got[1024]]
