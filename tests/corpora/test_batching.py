"""Evaluation windows: every token scored once with its true context (the paper's token counts)."""
import numpy as np
import pytest

import corpora
from corpora import EvalWindows, eval_batches, load_lines


@pytest.mark.parametrize("n,length,stride", [(100, 10, 10), (101, 10, 10), (7, 10, 10), (100, 10, 3),
                                             (100, 10, 1), (1000, 64, 17), (64, 64, 5)])
def test_eval_windows_score_every_token_once_with_its_true_context(n, length, stride):
    stream = np.arange(1, n + 1, dtype=np.int32)  # token t has value t + 1; eos is 0
    seen = np.zeros(n, dtype=int)
    for inputs, targets, weights in eval_batches(stream, length, stride, batch_size=4, eos_id=0):
        assert inputs.shape == targets.shape == weights.shape == (4, length)
        scored = weights > 0
        np.add.at(seen, targets[scored] - 1, 1)
        # each input is the previous token of the stream (eos before the first)
        assert (inputs[scored] == targets[scored] - 1).all()
        for row in range(4):
            cols = np.nonzero(scored[row])[0]
            if len(cols):
                # the window is one contiguous piece of the stream, encoded from position 0 ...
                assert (np.diff(targets[row, : cols[-1] + 1]) == 1).all()
                # ... and every scored token has at least L - S tokens of context (fewer only at the start)
                assert cols[0] >= min(length - stride, targets[row, cols[0]] - 1)
    assert (seen == 1).all()
    assert len(EvalWindows(n, length, stride)) >= 1


def test_eval_windows_reject_bad_stride():
    with pytest.raises(ValueError, match="stride"):
        EvalWindows(100, 10, 11)


@pytest.mark.parametrize("split,expected", [("valid", 217_646), ("test", 245_569)])
@pytest.mark.parametrize("length,stride", [(512, 512), (3072, 3072), (15512, 15512), (1000, 1000),
                                           (512, 256), (1024, 7), (64, 1)])
def test_wikitext103_scores_every_token_once(wikitext103, split, expected, length, stride):
    """The paper's token counts: WikiText-103 valid 217,646 and test 245,569 (word level, with <eos>)."""
    lines = load_lines({"source": "local", "path": str(wikitext103)}, split)
    tok = corpora.build_tokenizer("word", lines)
    stream = tok.encode_lines(lines)
    assert corpora.count_words(lines) == len(stream) == expected
    total = sum(w.sum() for _, _, w in eval_batches(stream, length, stride, 256, tok.eos_id))
    assert total == expected
