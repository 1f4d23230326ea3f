"""Progress of long work (experiment/runtime/progress.py): in a batch log, where tqdm's bar is off,
lines that say what is done and about how long is left; an evaluation's lengths and passkey
batches report through it."""
import logging

from experiment.evals import PasskeySpec, evaluate, evaluate_passkey
from experiment.train import train
from experiment.runtime import progress
from experiment.train import train
from tests.conftest import tiny_config


def test_without_a_terminal_a_line_says_what_is_done_and_what_is_left(caplog):
    caplog.set_level(logging.INFO, logger=progress.__name__)
    with progress.Progress("eval x L=8", 4, "batches", every_s=0) as p:  # pytest's capture is no terminal
        assert p.lines
        for _ in range(4):
            p.update()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and lines[0].startswith("eval x L=8: 1 of 4 batches (25%), ")  # none once complete
    assert all(" so far, about " in line and line.endswith(" left") for line in lines)
    caplog.clear()
    with progress.Progress("quiet", 4, "batches", every_s=0, shown=False) as p:  # not the writing process
        p.update(4)
    with progress.Progress("rare", 4, "batches", every_s=3600) as p:  # at most one line a minute by default
        p.update(3)
    assert caplog.records == []


def test_a_line_a_minute_while_one_item_takes_longer(caplog):
    """A single long item (one 16k-token forward pass) still shows the work moving."""
    import time
    caplog.set_level(logging.INFO, logger=progress.__name__)
    with progress.Progress("eval x L=16384", 2, "batches", every_s=0.2) as p:
        time.sleep(0.7)
        p.update()
    lines = [r.getMessage() for r in caplog.records]
    assert lines and lines[0].startswith("eval x L=16384: 0 of 2 batches done, ") and "working on the next" in lines[0]
    count = len(caplog.records)
    time.sleep(0.5)
    assert len(caplog.records) == count  # none once closed


def test_evaluations_report_each_batch_in_the_log(tmp_path, caplog, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.txt").write_text("the grass is green. the sky is blue. here we go.\n" * 100)
    config = tiny_config("alibi")
    config.data.update(dict(source="local", path=str(data)))
    config.train.steps = 2
    train(config, tmp_path / "run")
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger=progress.__name__)
    evaluate(tmp_path / "run", [32], batch_tokens=32 * 8)
    evaluate_passkey(tmp_path / "run", [32], PasskeySpec(depths=(0.0, 1.0), per_cell=8), batch_tokens=32 * 4)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("eval alibi L=32 S=32: 1 of ") for line in lines), lines
    assert any(line.startswith("passkey alibi L=32: 1 of 4 batches (25%)") for line in lines), lines
