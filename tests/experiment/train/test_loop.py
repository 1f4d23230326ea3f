"""Training: falling loss for every scheme, exact resume, data parallelism, and the end-to-end run."""
import json
import os
import pathlib
import signal

import numpy as np
import pytest

import posenc
from corpora import count_words, load_lines
from experiment.config import ConfigError
from experiment.evals import evaluate
from experiment.pipeline.run import train_and_evaluate
from experiment.report import write_report
from experiment.runtime import interrupts
from experiment.train import loop, train
from tests.conftest import tiny_config


def losses(workdir):
    return [json.loads(l)["loss"] for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


# In the default run, one scheme of each kind of hook (a bias, a rotation, a table, an absolute
# embedding, none, an MLP per pair, a logit transform, a carried bias, a bias from the content, a bias
# from the input, another normalisation, sampled positions); every other scheme (~6 s each) in the
# slow run, which covers them all.
DEFAULT_RUN = {"alibi", "rope", "t5", "sinusoidal", "learned", "nope", "fire", "dape", "cope", "deberta", "fox",
               "stickbreaking", "randomized"}


@pytest.mark.parametrize("name", [n if n in DEFAULT_RUN else pytest.param(n, marks=pytest.mark.slow)
                                  for n in posenc.names()])
def test_loss_falls_and_evaluation_reaches_4x_the_training_length(name, tmp_path):
    config = tiny_config(name)
    config.train.update(dict(steps=12, checkpoint_every=100, log_every=3, warmup_steps=3, lr=1e-2))
    train(config, tmp_path)
    curve = losses(tmp_path)
    assert len(curve) == 4 and all(np.isfinite(curve))
    assert curve[-1] < curve[0] - 0.3, curve
    # 4L = 64 on the first 2,048 tokens of the validation split, or the scheme's own clear refusal
    try:
        (record,) = evaluate(tmp_path, [4 * config.train.seq_len], max_tokens=2048)
    except posenc.LengthError as e:
        assert "max_length" in str(e) and posenc.get(name).extrapolates == "no"
    else:
        assert record["tokens"] == 2048 and np.isfinite(record["nll"])


def test_randomized_evaluation_draws_positions_per_window_whatever_the_batch(tmp_path):
    config = tiny_config("randomized")
    config.posenc.randomized.max_length = 64
    config.train.steps = 2
    train(config, tmp_path)
    (a,) = evaluate(tmp_path, [32], max_tokens=1024, batch_tokens=4096)
    (b,) = evaluate(tmp_path, [32], max_tokens=1024, batch_tokens=64)  # 2 windows per batch, not 32
    assert a["nll"] == pytest.approx(b["nll"], rel=1e-5)
    (c,) = evaluate(tmp_path, [32], max_tokens=1024, overrides={"posenc.randomized.eval_positions": "consecutive"})
    assert abs(c["nll"] - a["nll"]) > 1e-4  # 0 .. T-1 is another protocol, and another number
    with pytest.raises(posenc.LengthError, match="eval_positions=consecutive"):
        evaluate(tmp_path, [128], max_tokens=1024)


def test_end_to_end_interrupt_resume_evaluate_report(tmp_path, monkeypatch):
    config = tiny_config("alibi")
    straight = tmp_path / "straight"
    train(config, straight)

    # Stop the second run with a SIGTERM (kill, timeout, SLURM, docker stop) as its batch of step 2 is read:
    # held like a Ctrl-C, step 2 runs and a checkpoint is written at step 3, between two of every 2 steps.
    resumed = tmp_path / "resumed"
    real_batch = loop.corpora.train_batch

    def terminated_batch(stream, step, *args, **kwargs):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_batch(stream, step, *args, **kwargs)

    monkeypatch.setattr(loop.corpora, "train_batch", terminated_batch)
    with interrupts.deferred(), pytest.raises(interrupts.Interrupted, match="^interrupted at step 3 of 6; "
                                              "checkpoint saved at step 3: the same command resumes from it$"):
        try:
            train(config, resumed)
        finally:
            assert interrupts.exit_code() == 143
    monkeypatch.setattr(loop.corpora, "train_batch", real_batch)
    assert (resumed / "checkpoints" / "3").exists()
    assert len(losses(resumed)) == 3

    summary = train_and_evaluate(config, resumed)  # the same call resumes, then evaluates
    assert summary["done"] and summary["step"] == 6
    np.testing.assert_array_equal(losses(resumed), losses(straight))

    records = json.loads((resumed / "eval" / "extrapolation.json").read_text())
    assert [r["eval_length"] for r in records] == [16, 32]
    for r in records:
        assert {"scheme", "train_length", "eval_length", "stride", "tokens", "nll", "ppl"} <= set(r)
        assert r["scheme"] == "alibi" and r["train_length"] == 16 and r["stride"] == r["eval_length"]
        assert r["ppl"] == pytest.approx(np.exp(r["nll"])) and r["ppl"] < 256
    assert records[0]["tokens"] == records[1]["tokens"] > 10_000
    # byte-level runs also report word-level perplexity: the same total NLL over the word count
    words = count_words(load_lines(config.data, "valid"))
    assert records[0]["words"] == words
    assert records[0]["word_ppl"] == pytest.approx(np.exp(records[0]["nll"] * records[0]["tokens"] / words))

    sliding = evaluate(resumed, [32], stride=8, max_tokens=10**8)  # beyond the split: the whole split
    assert sliding[0]["tokens"] == records[0]["tokens"] and sliding[0]["max_tokens"] == 0  # issue 45, item 2
    assert len(json.loads((resumed / "eval" / "extrapolation.json").read_text())) == 3  # merged

    # an eval-time knob without retraining: recorded, merged beside the plain results
    with pytest.raises(ValueError, match="only posenc"):
        evaluate(resumed, [32], overrides={"train.lr": "1"})
    tiled = evaluate(resumed, [32], overrides={"model.attention": "blockwise", "model.attention_block": "8"})
    assert tiled[0]["overrides"] == {"model.attention": "blockwise", "model.attention_block": "8"}
    assert tiled[0]["nll"] == pytest.approx(records[1]["nll"], rel=1e-5)
    assert len(json.loads((resumed / "eval" / "extrapolation.json").read_text())) == 4

    paths = write_report([resumed, straight] if (straight / "eval").exists() else [resumed], tmp_path / "report")
    assert pathlib.Path(paths["png"]).stat().st_size > 10_000
    table = pathlib.Path(paths["md"]).read_text()
    assert "| 32 |" in table and f"{records[1]['ppl']:.2f}" in table and "stride 8" in table


def test_max_steps_slices_a_run(tmp_path):
    config = tiny_config("rope")
    first = train(config, tmp_path, max_steps=2)
    assert first == {**first, "step": 2, "done": False}
    second = train(config, tmp_path)
    assert second["step"] == 6 and second["done"]
    assert [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == list(range(1, 7))


def test_nag_optimizer_and_warmup_from_init_lr(tmp_path):
    config = tiny_config("alibi")
    config.train.update(dict(optimizer="nag", momentum=0.9, lr=0.3, warmup_init_lr=1e-7, steps=12,
                             warmup_steps=4, log_every=1, checkpoint_every=100))
    train(config, tmp_path)
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["lr"] < 1e-6  # warm-up starts at 1e-7 (float32 schedule arithmetic)
    assert records[4]["lr"] == pytest.approx(0.3)
    assert records[-1]["loss"] < records[0]["loss"] - 0.3
    seq_len = config.train.seq_len  # the attention path the compiled step runs, in every record
    assert {r["attention"] for r in records} == {f"triangular at {seq_len} tokens"}


def test_resume_refuses_a_different_config(tmp_path):
    config = tiny_config("alibi")
    train(config, tmp_path, max_steps=1)
    other = tiny_config("rope")
    with pytest.raises(ConfigError, match="posenc.name"):
        train(other, tmp_path)


def test_resume_accepts_options_added_later_and_other_schemes_blocks():
    from experiment.config import config_differences
    old = {"posenc": {"name": "alibi", "rope": {"base": 1.0}}, "model": {"d_model": 8}}
    new = {"posenc": {"name": "alibi", "rope": {"base": 2.0, "xpos": False}, "fire": {"w": 32}},
           "model": {"d_model": 8, "attention": "auto"}}
    assert config_differences(old, new) == []
    assert config_differences(old, {**new, "model": {"d_model": 16}}) == ["model.d_model: 8 -> 16"]
    assert config_differences(old, {**new, "posenc": {**new["posenc"], "name": "rope"}})
