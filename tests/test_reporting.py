"""The report: paper overlay where scheme and L match, per-position plot, tables."""
import json
import pathlib

import pytest

from experiment import paper, write_report
from tests.conftest import tiny_config


def fake_run(root: pathlib.Path, scheme: str, train_length: int, corpus_path: str, ppl_by_length: dict,
             tokenizer: str = "word") -> pathlib.Path:
    """A run folder as train.py + eval_extrapolate.py leave it, with given results (report input only)."""
    config = tiny_config(scheme)
    config.train.seq_len = train_length
    config.data.update(dict(source="local", path=corpus_path, tokenizer=tokenizer))
    workdir = root / f"{scheme}_{train_length}"
    (workdir / "eval").mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(config.to_dict()))
    records = [{"scheme": scheme, "train_length": train_length, "eval_length": l, "stride": l,
                "split": "valid", "tokens": 217646, "nll": 0.0, "ppl": p,
                "position_nll": [[0, l // 2 - 1, 3.0], [l // 2, l - 1, 2.9]]}
               for l, p in ppl_by_length.items()]
    (workdir / "eval" / "extrapolation.json").write_text(json.dumps(records))
    return workdir


def test_paper_numbers_are_shipped_and_match_the_reference():
    assert dict(paper.curve("alibi", 512, sliding=False))[512] == 19.73
    assert dict(paper.curve("rope", 512, sliding=False))[15512] == 79.25
    assert dict(paper.curve("sinusoidal", 512, sliding=True))[1024] == 204.42
    assert 15512 not in dict(paper.curve("t5", 512, sliding=False))  # OOM in the paper
    assert paper.curve("nope", 512, sliding=False) == []


def test_report_overlays_the_paper_only_where_it_matches(tmp_path):
    wiki = fake_run(tmp_path, "alibi", 512, "/data/wikitext-103", {512: 20.5, 1012: 19.9})
    demo = fake_run(tmp_path, "rope", 64, "/data/mycorpus", {64: 5.0, 128: 6.0})
    paths = write_report([wiki, demo], tmp_path / "report")
    text = pathlib.Path(paths["md"]).read_text()
    assert "| 512 | 20.50 | 19.73 |" in text and "| 1012 | 19.90 | 18.73 |" in text
    assert text.count("Press et al. 2022 (word ppl) |") == 1  # only the WikiText alibi run has one
    for key in ("png", "positions_png"):
        assert pathlib.Path(paths[key]).stat().st_size > 10_000
    never = pathlib.Path(write_report([wiki], tmp_path / "r2", paper_mode="never")["md"]).read_text()
    assert "19.73" not in never
    forced = pathlib.Path(write_report([demo], tmp_path / "r3", paper_mode="always")["md"]).read_text()
    assert "Press et al. 2022" not in forced  # the paper has no rope row at L=64
    with pytest.raises(ValueError, match="paper mode"):
        write_report([wiki], tmp_path / "r4", paper_mode="sometimes")


def test_report_uses_word_level_perplexity_for_subword_runs(tmp_path):
    run = fake_run(tmp_path, "alibi", 512, "/data/wikitext-103-raw", {512: 3.0}, tokenizer="byte")
    records = json.loads((run / "eval" / "extrapolation.json").read_text())
    records[0].update(words=217646, word_ppl=25.0)
    (run / "eval" / "extrapolation.json").write_text(json.dumps(records))
    text = pathlib.Path(write_report([run], tmp_path / "report")["md"]).read_text()
    # word-level perplexity beside the byte-level one; no paper column: its L_valid counts words
    assert "(word ppl)" in text and "| 512 | 3.00 | 25.00 |" in text and "Press" not in text
    forced = pathlib.Path(write_report([run], tmp_path / "r2", paper_mode="always")["md"]).read_text()
    assert "| 512 | 3.00 | 25.00 | 19.73 |" in forced
