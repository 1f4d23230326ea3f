"""Passkey retrieval through the experiment library: the scorer, evaluation of a trained run
(experiment/evals/passkey.py) and its report (experiment/report/passkey.py); the task itself:
tests/corpora/test_passkey.py."""
import json

import numpy as np
import pytest

from corpora import passkey as pk
from experiment.evals import PasskeySpec, evaluate_passkey
from experiment.evals.kinds import Request, check_request
from experiment.evals.passkey import cell_records, score_examples, spec_options
from experiment.train import train
from experiment.report import passkey as passkey_report
from experiment.store.run import RunDir
from experiment.train import train
from tests.conftest import run_entry, tiny_config


def test_scorer_gives_an_oracle_one_and_a_context_blind_model_chance(tokenizers):
    tok = tokenizers["byte"]
    batch = pk.passkey_batch(tok, 80, (0.0, 0.5, 1.0), 10, seed=1)
    eye = np.eye(tok.vocab_size, dtype=np.float32)
    oracle = lambda inputs, rows: eye[batch.targets[rows]]
    for size in (None, 7):  # padded last call included
        scores = score_examples(oracle, batch, size)
        assert scores.exact.all() and (scores.token_accuracy == 1).all()
    digit = eye[ord("5")]
    blind = lambda inputs, rows: np.broadcast_to(digit, (*inputs.shape, tok.vocab_size))
    scores = score_examples(blind, batch, 4)
    assert scores.exact.mean() == 0.0  # chance for 4 digits is 1e-4
    # argmax ids are accepted as well; one wrong answer digit makes the example wrong
    wrong_last = lambda inputs, rows: np.where(np.arange(80) == 79, 0, batch.targets[rows])
    scores = score_examples(wrong_last, batch)
    assert not scores.exact.any() and np.allclose(scores.token_accuracy, 0.75)
    records = cell_records(batch, score_examples(oracle, batch), 80, step=3)
    assert [(r["depth"], r["accuracy"], r["count"], r["step"]) for r in records] == [
        (0.0, 1.0, 10, 3), (0.5, 1.0, 10, 3), (1.0, 1.0, 10, 3)]


def test_evaluate_passkey_end_to_end_and_report(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid"):  # a local folder loads faster than the built-in corpus
        (data / f"{split}.txt").write_text("the grass is green. the sky is blue. here we go.\n" * 100)
    config = tiny_config("alibi")
    config.data.update(dict(source="local", path=str(data)))
    config.train.steps = 2
    run = tmp_path / "run"
    train(config, run)
    records = evaluate_passkey(run, [32, 64], PasskeySpec(depths=(0.0, 1.0), per_cell=3))
    assert [(r["eval_length"], r["depth"]) for r in records] == [(32, 0.0), (32, 1.0), (64, 0.0), (64, 1.0)]
    for r in records:
        assert r["task"] == "passkey" and 0.0 <= r["accuracy"] <= 1.0 and r["count"] == 3
        assert r["step"] == 2 and r["digits"] == 4 and r["scheme"] == "alibi" and r["train_length"] == 16
    assert RunDir(run).records("passkey") == records
    again = evaluate_passkey(run, [64], PasskeySpec(depths=(0.5,), per_cell=2, digits=2))  # merged beside the others
    saved = RunDir(run).records("passkey")
    assert len(saved) == 5 and again[0] in saved
    json.loads((run / "eval" / "passkey.json").read_text())
    with pytest.raises(pk.PasskeyError, match="length >= 18"):
        evaluate_passkey(run, [16])
    with pytest.raises(pk.PasskeyError, match="length >= 18"):  # checked before perplexity runs (issue 22, item 16)
        check_request(run, ("perplexity", "passkey"), Request(lengths=(16, 32)))
    with pytest.raises(ValueError, match=r"depths in \[0, 1\]"):
        check_request(run, ("passkey",), Request(lengths=(32,), options=spec_options(PasskeySpec(depths=(1.5,)))))
    out = run_entry("eval_extrapolate.py", "--workdir", str(run), "--passkey", "--lengths", "32",
                    "--passkey_depths", "0.25", "--passkey_per_cell", "1")  # passkey alone, no perplexity first
    assert out.returncode == 0 and "passkey L=    32  depth 0.25" in out.stdout, out.stderr[-2000:]
    assert not RunDir(run).records("perplexity") and len(RunDir(run).records("passkey")) == 6
    out = passkey_report.write([run], tmp_path / "report")
    assert all((tmp_path / "report" / name).stat().st_size > 0 for name in ("passkey_vs_length.png", "passkey.md"))
    assert len(out["heatmaps"]) == 2  # 4 and 2 digits
    table = passkey_report.passkey_table([("alibi", records)])
    assert "| 32 |" in table and "| depth | 32 | 64 |" in table
