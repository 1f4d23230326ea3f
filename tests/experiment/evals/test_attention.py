"""Attention statistics of a trained run (experiment/evals/attention.py), written as records and drawn
(experiment/report/attention.py)."""
import json

import numpy as np
import pytest

from experiment.evals import evaluate_attention
from experiment.train import train
from experiment.report import attention as attention_report, plots
from experiment.report.attention import attention_figure
from experiment.store.run import RunDir
from experiment.train import train
from tests.conftest import tiny_config


def test_attention_statistics_of_a_trained_run_and_its_plot(tmp_path):
    corpus = tmp_path / "corpus"  # a small local corpus: the built-in one takes seconds to read
    corpus.mkdir()
    for split, seed in (("train", 0), ("valid", 1)):
        words = np.random.default_rng(seed).choice(["the", "cat", "sat", "on", "a", "mat", "and"], 3000)
        (corpus / f"{split}.txt").write_text("\n".join(" ".join(words[i:i + 12]) for i in range(0, 3000, 12)))
    config = tiny_config("alibi")
    config.data.update(dict(source="local", path=str(corpus)))
    config.train.update(dict(steps=2, checkpoint_every=2))
    workdir = tmp_path / "run"
    train(config, workdir)
    records = evaluate_attention(workdir, [16, 64], max_windows=3, block=8)
    assert json.loads((workdir / "eval" / "attention.json").read_text()) == records == RunDir(workdir).records("attention")
    for record, length in zip(records, (16, 64)):
        assert (record["eval_length"], record["step"], record["split"]) == (length, 2, "valid")
        assert (record["layers"], record["heads"], record["windows"]) == (2, 4, 3)
        bins = record["positions"]
        assert bins[0] == [0, 0] and bins[-1][1] == length - 1 and len(bins) <= 64
        dist, ent = np.array(record["mean_distance"]), np.array(record["entropy"])
        assert dist.shape == ent.shape == (2, 4, len(bins))
        last = np.array([b for _, b in bins])
        assert np.all(dist >= -1e-5) and np.all(dist <= last + 1e-4)  # somewhere in the prefix
        assert np.all(ent >= -1e-5) and np.all(ent <= np.log(last + 1) + 1e-4)  # at most uniform
        assert dist[:, :, 0] == pytest.approx(0.0, abs=1e-6)  # the first query sees itself only
    again = evaluate_attention(workdir, [64], max_windows=2, block=8)  # replaces its own record only
    assert [(r["eval_length"], r["windows"]) for r in RunDir(workdir).records("attention")] == [(16, 3), (64, 2)]
    assert again == RunDir(workdir).records("attention")[1:]
    png = plots.save(attention_figure(RunDir(workdir).records("attention"), "alibi (tiny)", train_length=16),
                     tmp_path / "attention.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = [{"run": RunDir(workdir), "workdir": str(workdir), "label": "alibi (L=16)", "train_length": 16},
            {"run": RunDir(corpus), "workdir": str(corpus), "label": "not evaluated", "train_length": 16}]
    assert attention_report.write(runs, tmp_path / "report") == [str(tmp_path / "report" / "attention_run.png")]
