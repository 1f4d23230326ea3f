"""`--documents books`: the books scored as documents (corpora/books.py, here a made-up pair), each
record with its loss by position band (L = 64, the checkpoint's window) and by block."""
import pytest

from corpora import books as books_lib
from experiment.convert.hf import import_hf
from experiment.evals.kinds import Request, evaluate_kinds
from tests.experiment.convert.test_hf import checkpoint, local_corpus


@pytest.fixture
def imported(tmp_path):
    corpus = local_corpus(tmp_path, lines=20)
    return import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run", data={"source": "local", "path": str(corpus)})


def test_books_are_scored_as_documents_with_bands_and_blocks(imported, monkeypatch):
    tale = [books_lib.Book("One", "a tale of two lines about tokens.\n" * 80), books_lib.Book("Two", "short.\n")]
    monkeypatch.setattr(books_lib, "books", lambda: tale)
    monkeypatch.setattr(books_lib, "big_txt_path", lambda: "big.txt")  # installed or not, the pair is read
    options = {"documents": "books", "max_tokens": 700}
    out = evaluate_kinds(imported.path, ("perplexity",), Request(lengths=(256,), options=options))["perplexity"]
    short = len(imported.tokenizer(imported.load_config().data, write=False).encode_lines(["short."]))
    for r in out:  # the first 700 tokens of book one, all of book two
        assert r["split"] == "books" and r["documents"] == 2 and r["tokens"] == 700 + short
        assert r["max_tokens"] == 700 and r["train_length"] == 64
        assert [t for _, t, _ in r["block_nll"]] == [512, 188, short] and r["block_size"] == 512
    # windows end at 256, 512, 700 (the last scores its positions 68-255), then book two's one
    assert [b[:3] for b in out[0]["band_nll"]] == [[0, 63, 64 + 64 + short], [64, 127, 64 + 64 + 60],
                                                   [128, 255, 128 * 3]]
    assert [b[0] for b in out[0]["block_nll"]] == [0, 68, 0]  # where its first token sits in its window
    again = Request(lengths=(256,), options=options, skip_done=True)
    assert evaluate_kinds(imported.path, ("perplexity",), again) == {"perplexity": []}  # recorded as split books
    with pytest.raises(ValueError, match="--split valid and --documents books both name the text"):
        evaluate_kinds(imported.path, ("perplexity",), Request(lengths=(64,), options={**options, "split": "valid"}))
