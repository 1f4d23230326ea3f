"""experiment/report/bootstrap.py on synthetic numbers (a known difference, no difference, weights),
and the band report (experiment/report/bands.py) built on it."""
import json
import pathlib
import re

import numpy as np
import pytest

from experiment.report import bands, bootstrap, perplexity
from tests.experiment.report.synthetic import fake_run


def test_a_shift_every_block_shares_is_certain_however_noisy_the_loss():
    rng = np.random.default_rng(0)
    base = rng.normal(3.0, 1.0, size=200)  # very unequal blocks
    got = bootstrap.paired_bootstrap(base + 0.05 + rng.normal(0, 0.01, 200), base, np.full(200, 512))
    assert got.low < 0.05 < got.high and got.high - got.low < 0.01 and got.certain
    assert got.blocks == 200 and got.tokens == 200 * 512
    assert re.fullmatch(r"\+5\.\d% \[\+[45]\.\d, \+5\.\d\]", bootstrap.percent(got))  # exp(0.05) - 1 = 5.1%


def test_the_estimate_weights_blocks_by_their_tokens_and_the_draws_are_seeded():
    got = bootstrap.paired_bootstrap([1.0, 2.0], [0.0, 0.0], [3, 1], samples=50)
    assert got.estimate == pytest.approx(1.25)
    again = bootstrap.paired_bootstrap([1.0, 2.0], [0.0, 0.0], [3, 1], samples=50)
    assert (got.low, got.high) == (again.low, again.high) and 1.0 <= got.low <= got.high <= 2.0
    with pytest.raises(ValueError, match="the same blocks"):
        bootstrap.paired_bootstrap([1.0, 2.0], [0.0], [1, 1])


def test_without_a_difference_the_interval_holds_zero_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    covered = 0
    for trial in range(100):
        a, b = rng.normal(2.0, 0.3, size=(2, 120))
        covered += not bootstrap.paired_bootstrap(a, b, np.full(120, 512), samples=400, seed=trial).certain
    assert 88 <= covered <= 99


def _records(method, shift, same_as=None):
    """A run's records at 32 (L = 8): three bands, 8 blocks of 4 tokens; `shift` added to the loss
    from position `shift[0]` on (the far bands)."""
    start, amount = shift
    rng = np.random.default_rng(7)
    base = rng.normal(2.0, 0.5, size=8)
    firsts = [0, 4, 8, 12, 16, 20, 24, 28]
    loss = [b + (amount if p >= start else 0.0) for b, p in zip(base, firsts)]
    bands_ = [[0, 7, 8, float(np.mean(loss[:2]))], [8, 15, 8, float(np.mean(loss[2:4]))],
              [16, 31, 16, float(np.mean(loss[4:]))]]
    r = {"method": method, "eval_length": 32, "stride": 32, "split": "books", "tokens": 32, "max_tokens": 0,
         "nll": float(np.mean(loss)), "ppl": float(np.exp(np.mean(loss))), "band_nll": bands_,
         "block_size": 4, "block_nll": [[p, 4, float(v)] for p, v in zip(firsts, loss)]}
    return {**r, "same_as": same_as} if same_as else r


def test_the_band_report_shows_where_a_method_differs_from_direct_and_lm_infinite(tmp_path):
    run = fake_run(tmp_path, "rope", 8, "/data/books", {32: 7.0}, tokenizer="pretrained")
    path = run / "eval" / "extrapolation.json"
    header = {k: v for k, v in json.loads(path.read_text())[0].items() if k in ("scheme", "train_length", "step",
                                                                               "tokenizer", "data")}
    recs = [{**header, **_records("direct", (8, 0.0))}, {**header, **_records("yarn", (8, -0.2))},
            {**header, **_records("lm_infinite", (16, -0.1))}]
    path.write_text(json.dumps(recs))
    (tmp_path / "report").mkdir()
    paths = perplexity.write(perplexity.load_runs([run]), tmp_path / "report")
    text = pathlib.Path(paths["bands_md"]).read_text()
    assert "| method | all | < L (0-7) | L-2L (8-15) | 2L-4L (16-31) |" in text
    direct_rows = text.split("against the model as trained (direct)")[1].split("against LM-Infinite")[0]
    yarn = next(line for line in direct_rows.splitlines() if line.startswith("| yarn |"))
    cells = [c.strip() for c in yarn.strip("|").split("|")]
    assert cells[2] == "+0.0% [+0.0, +0.0]"  # the first band: the same losses
    assert cells[3].startswith("**-18.1%") and cells[4].startswith("**-18.1%")  # exp(-0.2) - 1 on every far block
    lm_rows = text.split("against LM-Infinite")[1]
    assert "| yarn |" in lm_rows and "| direct |" in lm_rows
    assert bands.groups({"records": recs})  # every record holds bands: one group
    # the perplexity table names the books as its text, not the run's own dataset
    assert "on the four books of corpora/books.py" in pathlib.Path(paths["md"]).read_text()


def test_resampling_documents_shows_a_difference_that_one_book_carries():
    """Four documents of 8 blocks; A is 0.3 nats better than B in one document and equal in the others:
    blocks taken as independent call it certain; resampling documents (their blocks together) does not,
    and the per-document differences say where it comes from."""
    rng = np.random.default_rng(3)
    b = rng.normal(3.0, 0.01, size=32)
    a = b.copy()
    a[8:16] -= 0.3
    tokens = np.full(32, 512)
    firsts = np.tile(np.arange(8) * 512, 4)  # each document one window from position 0
    docs = bootstrap.windows_of(firsts)
    assert docs.tolist() == [i // 8 for i in range(32)]
    blocks = bootstrap.paired_bootstrap(a, b, tokens)
    by_doc = bootstrap.paired_bootstrap(a, b, tokens, clusters=docs)
    assert blocks.certain and not by_doc.certain and by_doc.estimate == pytest.approx(blocks.estimate)
    assert bootstrap.per_cluster(a, b, tokens, docs) == pytest.approx([0.0, -0.3, 0.0, 0.0])
    record = {"eval_length": 4096, "tokens": 4 * 4096, "max_tokens": 4096, "documents": 4,
              "block_nll": [[int(p), 512, float(x)] for p, x in zip(firsts, a)]}
    reference = {**record, "block_nll": [[int(p), 512, float(x)] for p, x in zip(firsts, b)]}
    each, interval = bands.by_document(record, reference, 4096)["all"]
    assert each == pytest.approx([0.0, -0.3, 0.0, 0.0]) and not interval.certain
