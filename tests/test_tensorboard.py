"""The TensorFlow-free TensorBoard event writer: CRC-32C, hand-encoded protobuf, TFRecord framing,
round trip through the reader, and (when tensorboard is installed) TensorBoard's own loader."""
from __future__ import annotations

import json
import math
import re
import struct

import pytest

from experiment import tensorboard as tb


def _raw_records(path) -> list[bytes]:
    """Split a TFRecord file by hand (length, length CRC, data, data CRC), no CRC checks."""
    buf, out, pos = path.read_bytes(), [], 0
    while pos < len(buf):
        (length,) = struct.unpack("<Q", buf[pos:pos + 8])
        out.append(buf[pos:pos + 12 + length + 4])
        pos += 12 + length + 4
    return out


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % 2**32


def test_crc32c_check_values():
    for fn in (tb._crc32c_py, tb.crc32c):
        assert fn(b"123456789") == 0xE3069283  # the CRC catalogue's check value
        assert fn(b"") == 0
        assert fn(bytes(32)) == 0x8A9136AA  # RFC 3720, B.4
        assert fn(b"\xff" * 32) == 0x62A8AB43
        assert fn(bytes(range(32))) == 0x46DD794E


def test_masked_crc32c_formula():
    crc = 0xE3069283
    rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    expected = (rotated + 0xA282EAD8) % 2**32
    assert expected == 0xC78AB0E5
    assert tb.masked_crc32c(b"123456789") == expected


def test_varint():
    assert tb._varint(0) == b"\x00"
    assert tb._varint(1) == b"\x01"
    assert tb._varint(127) == b"\x7f"
    assert tb._varint(128) == b"\x80\x01"
    assert tb._varint(300) == b"\xac\x02"
    assert tb._varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes


def test_event_bytes_match_hand_encoding(tmp_path):
    with tb.EventWriter(tmp_path) as w:
        w.scalar("loss", 2.5, step=3, wall_time=1.0)
    records = _raw_records(w.path)
    assert len(records) == 2
    # Value { tag = 1: "loss" (key 0x0a, len 4), simple_value = 2: 2.5f (key 0x15, 00 00 20 40) }
    value = b"\x0a\x04loss" + b"\x15\x00\x00\x20\x40"
    assert len(value) == 11
    summary = b"\x0a\x0b" + value  # Summary { value = 1 (key 0x0a, len 11) }
    # Event { wall_time = 1: 1.0d (key 0x09), step = 2: 3 (key 0x10), summary = 5 (key 0x2a, len 13) }
    expected = (b"\x09\x00\x00\x00\x00\x00\x00\xf0\x3f" + b"\x10\x03" + b"\x2a\x0d" + summary)
    assert expected.hex() == "09000000000000f03f10032a0d0a0b0a046c6f73731500002040"
    header = struct.pack("<Q", len(expected))
    assert header == b"\x1a" + bytes(7)  # 26 bytes
    framed = (header + struct.pack("<I", _mask(tb.crc32c(header))) + expected
              + struct.pack("<I", _mask(tb.crc32c(expected))))
    assert records[1] == framed


def test_first_event_is_file_version(tmp_path):
    with tb.EventWriter(tmp_path) as w:
        pass
    (record,) = _raw_records(w.path)
    payload = record[12:-4]
    # wall_time (key 0x09 + 8 bytes), step 0 left out (proto3 default), file_version = 3 (key 0x1a)
    assert payload[:1] == b"\x09" and payload[9:] == b"\x1a\x0dbrain.Event:2"
    (event,) = tb.read_events(w.path)
    assert event["file_version"] == "brain.Event:2" and event["step"] == 0
    assert event["wall_time"] == pytest.approx(w.path.stat().st_mtime, abs=60)


def test_round_trip_and_flush(tmp_path):
    written = [
        (0, {"train/loss": 1.0 / 3.0, "train/lr": 3e-4}),
        (10, {"train/loss": 0.123456789}),
        (2**40, {"eval/ppl@1024": 12345.678, "big": 1e40, "nan": math.nan, "neg": -2.0}),
        (-1, {"zero": 0.0}),
    ]
    w = tb.EventWriter(tmp_path / "logs")
    for i, (step, values) in enumerate(written):
        w.scalars(values, step, wall_time=100.0 + i)
    w.scalar("single", 7, 11)
    w.scalars({}, 12)  # nothing written
    # Every record is flushed as written: readable before close.
    before_close = w.path.read_bytes()
    events = tb.read_events(w.path)
    w.close()
    assert w.path.read_bytes() == before_close
    assert events[0]["file_version"] == "brain.Event:2"
    assert len(events) == 1 + len(written) + 1
    for event, (i, (step, values)) in zip(events[1:], enumerate(written)):
        assert event["step"] == step and event["wall_time"] == 100.0 + i
        assert set(event["scalars"]) == set(values)
        for tag, v in values.items():
            got = event["scalars"][tag]
            if math.isnan(v):
                assert math.isnan(got)
            elif abs(v) > 3.5e38:
                assert got == math.inf
            else:
                assert got == struct.unpack("<f", struct.pack("<f", v))[0]
    assert events[-1]["step"] == 11 and events[-1]["scalars"] == {"single": 7.0}


def test_file_name_pattern(tmp_path):
    with tb.EventWriter(tmp_path) as a, tb.EventWriter(tmp_path) as b:
        pass
    pattern = r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)"
    for w in (a, b):
        m = re.fullmatch(pattern, w.path.name)
        assert m and w.path.parent == tmp_path
        assert int(m.group(3)) > 0
    assert a.path != b.path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.path.name, b.path.name])


def test_crc_corruption_detected(tmp_path):
    with tb.EventWriter(tmp_path) as w:
        w.scalar("loss", 2.5, 3, wall_time=1.0)
    good = w.path.read_bytes()
    first = len(_raw_records(w.path)[0])
    for offset in (first + 20, first + 3, len(good) - 1):  # data, length, data CRC
        bad = bytearray(good)
        bad[offset] ^= 0x01
        w.path.write_bytes(bytes(bad))
        with pytest.raises(ValueError, match="CRC"):
            tb.read_events(w.path)


def test_truncated_tail(tmp_path):
    with tb.EventWriter(tmp_path) as w:
        w.scalar("a", 1.0, 1)
        w.scalar("a", 2.0, 2)
    w.path.write_bytes(w.path.read_bytes()[:-5])  # a writer that died mid-record
    events = tb.read_events(w.path)
    assert [e["step"] for e in events] == [0, 1]
    with pytest.raises(ValueError, match="truncated"):
        tb.read_events(w.path, strict=True)


def test_closed_writer(tmp_path):
    with tb.EventWriter(tmp_path) as w:
        w.flush()
    assert w.closed
    w.close()  # harmless
    with pytest.raises(ValueError, match="closed"):
        w.scalar("loss", 1.0, 1)


def test_tensorboard_reads_the_file(tmp_path):
    loader_mod = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    with tb.EventWriter(tmp_path) as w:
        w.scalars({"loss": 2.5, "acc": 0.75}, step=3, wall_time=1.0)
        w.scalar("loss", 1.25, step=4, wall_time=2.0)
    events = list(loader_mod.EventFileLoader(str(w.path)).Load())
    assert events[0].file_version == "brain.Event:2"
    got = []
    for e in events[1:]:
        for v in e.summary.value:
            if v.HasField("simple_value"):
                value = v.simple_value
            else:  # newer loaders migrate scalars to tensors
                from tensorboard.util import tensor_util
                value = float(tensor_util.make_ndarray(v.tensor).item())
            got.append((e.step, e.wall_time, v.tag, value))
    assert got == [(3, 1.0, "loss", 2.5), (3, 1.0, "acc", 0.75), (4, 2.0, "loss", 1.25)]


def test_training_and_evaluation_write_tensorboard_events(tmp_path):
    """(and train_and_evaluate honours config.eval, stride included)"""
    from experiment import train_and_evaluate
    from experiment.tensorboard import read_events
    from tests.conftest import tiny_config
    config = tiny_config("alibi")
    config.train.update(steps=2, log_every=1)
    config.eval.update(dict(length_multipliers=(1, 2), stride=8, max_tokens=256))
    summary = train_and_evaluate(config, tmp_path)
    assert [(r["eval_length"], r["stride"]) for r in summary["eval"]] == [(16, 8), (32, 8)]
    scalars = {}
    for path in sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*")):
        for event in read_events(path):
            for tag, value in event.get("scalars", {}).items():
                scalars[(tag, event["step"])] = value
    losses = [json.loads(l)["loss"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [scalars[("train/loss", s)] for s in (1, 2)] == pytest.approx(losses, rel=1e-6)
    record = json.loads((tmp_path / "eval" / "extrapolation.json").read_text())[0]
    assert scalars[("eval/valid/ppl_L16_S8_first256", 2)] == pytest.approx(record["ppl"], rel=1e-6)
