"""The TensorBoard event writer (experiment/store/tensorboard.py, tensorboardX underneath), read back with
TensorBoard's own readers: its event-file loader (which checks both CRCs of every record) and its
EventAccumulator."""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import socket

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator, event_file_loader

from experiment.store import tensorboard as tb


def _events(path) -> list:
    """The Event protos of one file, as TensorBoard reads them (no migration of simple_value)."""
    return list(event_file_loader.LegacyEventFileLoader(str(path)).Load())


def _scalars(path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of one event file, through TensorBoard's EventAccumulator."""
    acc = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _f32(value: float) -> float:
    return float(np.float32(value))


def test_round_trip(tmp_path):
    """Tags, steps, wall times and float32 values come back event by event; NaN stays NaN, values
    beyond float32 become +-inf; every event is on disk before close."""
    written = [
        (0, {"train/loss": 1.0 / 3.0, "train/lr": 3e-4}),
        (10, {"train/loss": 0.123456789}),
        (2**40, {"eval/valid/ppl_L64_S32_first1024_scale=4": 12345.678, "big": 1e40, "nan": math.nan,
                 "ninf": -math.inf, "neg": -2.0}),
        (-1, {"zero": 0.0}),
    ]
    w = tb.EventWriter(tmp_path / "logs")
    assert w.path.parent == tmp_path / "logs"
    for i, (step, values) in enumerate(written):
        w.scalars(values, step, wall_time=100.0 + i)
    w.scalar("single", np.float32(7), 11)  # wall_time: now
    w.scalars({}, 12)  # nothing written
    before_close = w.path.read_bytes()
    events = _events(w.path)  # readable before close: each event was flushed as written
    w.close()
    assert w.path.read_bytes() == before_close
    assert events[0].file_version == tb.FILE_VERSION == "brain.Event:2"
    assert events[0].wall_time == pytest.approx(w.path.stat().st_mtime, abs=60)
    assert len(events) == 1 + len(written) + 1
    for event, (i, (step, values)) in zip(events[1:], enumerate(written)):
        assert event.step == step and event.wall_time == 100.0 + i
        got = {v.tag: v.simple_value for v in event.summary.value}
        assert list(got) == list(values)  # tags as given ('=' kept), in order, one event per call
        for tag, v in values.items():
            if math.isnan(v):
                assert math.isnan(got[tag])
            elif abs(v) > 3.5e38:
                assert got[tag] == math.copysign(math.inf, v)
            else:
                assert got[tag] == _f32(v)
    last = events[-1]
    assert last.step == 11 and [(v.tag, v.simple_value) for v in last.summary.value] == [("single", 7.0)]
    assert last.wall_time == pytest.approx(w.path.stat().st_mtime, abs=60)


def test_event_accumulator_reads_scalars(tmp_path):
    with tb.EventWriter(tmp_path) as w:
        w.scalars({"loss": 2.5, "acc": 0.75}, step=3, wall_time=1.0)
        w.scalar("loss", 1.25, step=4, wall_time=2.0)
        w.scalar("eval/valid/ppl_L32", math.nan, step=4)
    scalars = _scalars(w.path)
    assert sorted(scalars) == ["acc", "eval/valid/ppl_L32", "loss"]
    assert scalars["loss"] == [(3, 2.5), (4, 1.25)] and scalars["acc"] == [(3, 0.75)]
    ((step, value),) = scalars["eval/valid/ppl_L32"]
    assert step == 4 and math.isnan(value)


def test_one_file_per_writer(tmp_path, monkeypatch):
    """TensorFlow's naming, one new file per writer; an existing file of that name is left alone."""
    with tb.EventWriter(tmp_path) as a, tb.EventWriter(tmp_path) as b:
        a.scalar("x", 1.0, 1)
        b.scalar("x", 2.0, 1)
    pattern = r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)"
    for w in (a, b):
        m = re.fullmatch(pattern, w.path.name)
        assert m and w.path.parent == tmp_path
        assert m.group(2) == socket.gethostname() and int(m.group(3)) == os.getpid()
    assert a.path != b.path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.path.name, b.path.name])
    assert _scalars(a.path) == {"x": [(1, 1.0)]} and _scalars(b.path) == {"x": [(1, 2.0)]}

    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setattr(tb.time, "time", lambda: 1700000000.5)
    monkeypatch.setattr(tb, "_file_counter", itertools.count(0))
    taken = other / f"events.out.tfevents.1700000000.{socket.gethostname()}.{os.getpid()}.0"
    taken.write_bytes(b"not ours")
    with tb.EventWriter(other) as c:
        pass
    assert c.path.name.endswith(f".{os.getpid()}.1")
    assert taken.read_bytes() == b"not ours"


def test_a_file_where_the_folder_belongs_is_refused_by_name(tmp_path):
    (tmp_path / "tensorboard").write_text("not a folder")
    with pytest.raises(ValueError, match=r"tensorboard is damaged \(a file where the folder .* delete it \(rm "):
        tb.EventWriter(tmp_path / "tensorboard")


def test_closed_writer(tmp_path):
    with tb.EventWriter(tmp_path) as w:
        w.flush()
    assert w.closed
    w.close()  # harmless
    with pytest.raises(ValueError, match="closed"):
        w.scalar("loss", 1.0, 1)


def test_closed_on_interrupt(tmp_path):
    """Leaving the with block by KeyboardInterrupt closes the writer with every event on disk."""
    with pytest.raises(KeyboardInterrupt):
        with tb.EventWriter(tmp_path) as w:
            w.scalar("train/loss", 3.0, 1)
            w.scalar("train/loss", 2.0, 2)
            raise KeyboardInterrupt
    assert w.closed
    assert _scalars(w.path) == {"train/loss": [(1, 3.0), (2, 2.0)]}


def test_training_and_evaluation_write_tensorboard_events(tmp_path):
    """A tiny run: TensorBoard finds train/loss at the logged steps and the eval/valid/ppl_L* scalars
    of the evaluation (one file per writer), equal in float32 to metrics.jsonl and
    eval/extrapolation.json (and train_and_evaluate honours config.eval, stride included)."""
    from experiment.pipeline.run import train_and_evaluate
    from tests.conftest import tiny_config
    config = tiny_config("alibi")
    config.train.update(steps=2, log_every=1)
    config.eval.update(dict(length_multipliers=(1, 2), stride=8, max_tokens=256))
    summary = train_and_evaluate(config, tmp_path)
    assert [(r["eval_length"], r["stride"]) for r in summary["eval"]] == [(16, 8), (32, 8)]

    files = sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    by_file = [_scalars(path) for path in files]
    (train,) = [s for s in by_file if "train/loss" in s]
    (evaluation,) = [s for s in by_file if any(tag.startswith("eval/") for tag in s)]
    assert len(files) == 2  # one writer for training, one for the evaluation

    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert train["train/loss"] == [(m["step"], _f32(m["loss"])) for m in metrics]
    assert train["train/lr"] == [(m["step"], _f32(m["lr"])) for m in metrics]
    assert all(tag.startswith("train/") for tag in train)

    records = json.loads((tmp_path / "eval" / "extrapolation.json").read_text())
    assert evaluation == {f"eval/valid/ppl_L{r['eval_length']}_S8_first256": [(2, _f32(r["ppl"]))]
                          for r in records}
    assert sorted(evaluation) == ["eval/valid/ppl_L16_S8_first256", "eval/valid/ppl_L32_S8_first256"]


def run_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of a whole folder of event files, read in order as TensorBoard
    reads a run (purging what a SessionLog START abandons)."""
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_run_resumed_from_an_older_checkpoint_shows_each_step_once(tmp_path, monkeypatch):
    """Steps 1-6 logged, the checkpoint of step 4 resumed from: TensorBoard shows steps 5 and 6
    once, with the values the resumed run logged, as metrics.jsonl does."""
    from experiment import config as config_lib
    from experiment.store.run import RunDir
    from experiment.train.metrics import MetricsLog, Throughput
    from tests.conftest import tiny_config
    monkeypatch.setattr(tb, "_file_counter", itertools.count(0))  # names in creation order within a second
    config, run = config_lib.resolve(tiny_config("alibi")), RunDir(tmp_path, writer=True)

    def train(start: int, last: int, offset: float) -> None:
        with MetricsLog(run, config, start, Throughput(128, 1.0, None, 1)) as log:
            for step in range(start + 1, last + 1):
                log.add({"loss": np.float32(offset + step), "grad_norm": np.float32(1.0)})
                log.log(step)

    train(0, 6, 10.0)
    run.truncate_metrics(4)
    train(4, 6, 20.0)
    expected = [(1, 11.0), (2, 12.0), (3, 13.0), (4, 14.0), (5, 25.0), (6, 26.0)]
    assert run_scalars(run.tensorboard_dir)["train/loss"] == expected
    assert [(m["step"], m["loss"]) for m in map(json.loads, run.metrics_path.read_text().splitlines())] == expected
