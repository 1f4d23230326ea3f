"""TensorBoard scalar event files, written (and read back) without TensorFlow or protobuf.

A run's metrics.jsonl stays the source of truth; these files only let TensorBoard plot the same
numbers (`tensorboard --logdir WORKDIR`).

Formats followed:
- TFRecord framing (tensorflow/core/lib/io/record_writer.cc; "TFRecord format" in the TensorFlow
  guide): each record is `uint64 length` (little endian), `uint32 masked_crc32c(length bytes)`,
  `data`, `uint32 masked_crc32c(data)`, where masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8
  (mod 2**32) and crc is CRC-32C (Castagnoli).
- tensorflow/core/util/event.proto: `Event { double wall_time = 1; int64 step = 2;
  oneof what { string file_version = 3; Summary summary = 5; ... } }`.
- tensorflow/core/framework/summary.proto: `Summary { repeated Value value = 1; }`,
  `Value { string tag = 1; oneof value { float simple_value = 2; ... } }`.

Protobuf is encoded by hand (protobuf.dev/programming-guides/encoding): proto3 leaves out fields
that hold their default value (wall_time 0.0, step 0), while a set oneof member (file_version,
summary, simple_value) is always written. The first event of each file is
`file_version = "brain.Event:2"`, as TensorFlow writes it.
"""
from __future__ import annotations

import itertools
import math
import os
import pathlib
import socket
import struct
import threading
import time
from collections.abc import Mapping

FILE_VERSION = "brain.Event:2"

# ---------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli), reflected polynomial 0x82F63B78.


def _make_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _make_table()


def _crc32c_py(data: bytes) -> int:
    """CRC-32C of `data`, in pure Python (table driven, one byte at a time)."""
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _fast_crc32c():
    """A compiled CRC-32C from the `crc32c` or `google_crc32c` package, when one is installed."""
    try:
        import crc32c as _c  # type: ignore[import-not-found]
        return lambda data: _c.crc32c(bytes(data))
    except ImportError:
        pass
    try:
        import google_crc32c as _g  # type: ignore[import-not-found]
        return lambda data: _g.value(bytes(data))
    except ImportError:
        return None


_FAST_CRC32C = _fast_crc32c()
if _FAST_CRC32C is not None and _FAST_CRC32C(b"123456789") != 0xE3069283:  # not the package we know
    _FAST_CRC32C = None


def crc32c(data: bytes) -> int:
    """CRC-32C of `data`: a compiled package's when one is installed, else `_crc32c_py`."""
    return _FAST_CRC32C(data) if _FAST_CRC32C is not None else _crc32c_py(data)


def masked_crc32c(data: bytes) -> int:
    """The TFRecord checksum: CRC-32C of `data`, rotated right by 15 bits plus 0xa282ead8."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _record(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc32c(header)) + data
            + struct.pack("<I", masked_crc32c(data)))


# ---------------------------------------------------------------------------------------------
# Protobuf wire format (varint 0, 64-bit 1, length-delimited 2, 32-bit 5).

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    """Base-128 varint; negative int64 values take ten bytes (two's complement), as in protobuf."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, wire_type: int, payload) -> bytes:
    """One field: its key, then `payload` (an int for varints, the encoded bytes otherwise;
    length-delimited payloads get their length prefixed here)."""
    key = _varint((number << 3) | wire_type)
    if wire_type == _WIRE_VARINT:
        return key + _varint(payload)
    if wire_type == _WIRE_LEN:
        return key + _varint(len(payload)) + bytes(payload)
    if wire_type in (_WIRE_I64, _WIRE_I32):
        return key + bytes(payload)
    raise ValueError(f"unsupported wire type {wire_type}")


def _float32(value: float) -> bytes:
    """Little-endian float32; values beyond its range become +-inf (struct would raise)."""
    value = float(value)
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def _encode_event(wall_time: float, step: int, *, file_version: str | None = None,
                  scalars: Mapping[str, float] | None = None) -> bytes:
    """An Event message holding either `file_version` or a Summary of simple_value scalars."""
    out = b""
    packed_time = struct.pack("<d", float(wall_time))
    if packed_time != bytes(8):
        out += _field(1, _WIRE_I64, packed_time)
    if int(step) != 0:
        out += _field(2, _WIRE_VARINT, int(step))
    if file_version is not None:
        out += _field(3, _WIRE_LEN, file_version.encode("utf-8"))
    if scalars is not None:
        summary = b"".join(
            _field(1, _WIRE_LEN, _field(1, _WIRE_LEN, str(tag).encode("utf-8"))
                   + _field(2, _WIRE_I32, _float32(value)))
            for tag, value in scalars.items())
        out += _field(5, _WIRE_LEN, summary)
    return out


# ---------------------------------------------------------------------------------------------
# Writer.

_file_counter = itertools.count()


class EventWriter:
    """Appends scalar summaries to one new event file in `logdir`.

    The file is `events.out.tfevents.<time>.<hostname>.<pid>.<n>` (TensorFlow's naming; n counts
    the writers of this process). One file handle stays open; every record is written whole and
    flushed to the OS at once, so a crash of the process loses at most the record being written.
    `flush()` also fsyncs. Use as a context manager, or call `close()`.
    """

    def __init__(self, logdir: str | os.PathLike):
        self.logdir = pathlib.Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        now = time.time()
        while True:
            name = (f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}."
                    f"{os.getpid()}.{next(_file_counter)}")
            try:
                self._file = open(self.logdir / name, "xb")
                break
            except FileExistsError:
                continue
        self.path = self.logdir / name
        self._write(_encode_event(now, 0, file_version=FILE_VERSION))

    def _write(self, event: bytes) -> None:
        with self._lock:
            if self._file is None:
                raise ValueError(f"EventWriter for {self.path} is closed")
            self._file.write(_record(event))
            self._file.flush()

    def scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Write one scalar (stored as float32) at `step`; wall_time defaults to now."""
        self.scalars({tag: value}, step, wall_time)

    def scalars(self, values: Mapping[str, float], step: int, wall_time: float | None = None) -> None:
        """Write several scalars at `step` as one event (one record); nothing when `values` is empty.
        Values must convert with float(); they are stored as float32."""
        if not values:
            return
        event = _encode_event(time.time() if wall_time is None else wall_time, int(step),
                              scalars={str(k): float(v) for k, v in values.items()})
        self._write(event)

    def flush(self) -> None:
        """Push what was written to disk (flush and fsync)."""
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        """Flush and close the file; further writes raise ValueError. Closing twice is harmless."""
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            finally:
                self._file.close()
                self._file = None

    @property
    def closed(self) -> bool:
        return self._file is None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Reader.


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("malformed varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def _parse_fields(buf: bytes):
    """Yield (field number, wire type, value): an int for varints, bytes for the rest."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _WIRE_VARINT:
            value, pos = _read_varint(buf, pos)
        elif wire_type in (_WIRE_I64, _WIRE_I32):
            size = 8 if wire_type == _WIRE_I64 else 4
            value, pos = buf[pos:pos + size], pos + size
        elif wire_type == _WIRE_LEN:
            size, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        if pos > len(buf):
            raise ValueError("truncated protobuf message")
        yield number, wire_type, value


def _decode_event(data: bytes) -> dict:
    event: dict = {"wall_time": 0.0, "step": 0}
    for number, wire_type, value in _parse_fields(data):
        if number == 1 and wire_type == _WIRE_I64:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire_type == _WIRE_VARINT:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3 and wire_type == _WIRE_LEN:
            event["file_version"] = value.decode("utf-8")
        elif number == 5 and wire_type == _WIRE_LEN:
            scalars = event.setdefault("scalars", {})
            for vnum, vwire, vbytes in _parse_fields(value):
                if vnum != 1 or vwire != _WIRE_LEN:
                    continue
                tag, simple = None, None
                for fnum, fwire, fval in _parse_fields(vbytes):
                    if fnum == 1 and fwire == _WIRE_LEN:
                        tag = fval.decode("utf-8")
                    elif fnum == 2 and fwire == _WIRE_I32:
                        simple = struct.unpack("<f", fval)[0]
                if tag is not None and simple is not None:  # other value kinds are skipped
                    scalars[tag] = simple
    return event


def read_records(path: str | os.PathLike, *, strict: bool = False) -> list[bytes]:
    """The payloads of the TFRecords in `path`, both CRCs checked (ValueError on a mismatch).
    A truncated last record (a writer that died mid-write) is dropped, or raises when `strict`."""
    buf = pathlib.Path(path).read_bytes()
    out, pos = [], 0
    while pos < len(buf):
        if pos + 12 > len(buf):
            if strict:
                raise ValueError(f"{path}: truncated record header at byte {pos}")
            break
        header = buf[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        if header_crc != masked_crc32c(header):
            raise ValueError(f"{path}: length CRC mismatch in the record at byte {pos}")
        end = pos + 12 + length + 4
        if end > len(buf):
            if strict:
                raise ValueError(f"{path}: truncated record at byte {pos}")
            break
        data = buf[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", buf[end - 4:end])
        if data_crc != masked_crc32c(data):
            raise ValueError(f"{path}: data CRC mismatch in the record at byte {pos}")
        out.append(data)
        pos = end
    return out


def read_events(path: str | os.PathLike, *, strict: bool = False) -> list[dict]:
    """The events of an event file as dicts: {"wall_time", "step"} plus "file_version" (str) or
    "scalars" ({tag: simple_value}); other event kinds and summary values are skipped over.
    Raises ValueError on a CRC mismatch or a malformed message (see `read_records` for `strict`)."""
    return [_decode_event(data) for data in read_records(path, strict=strict)]


__all__ = ["EventWriter", "FILE_VERSION", "crc32c", "masked_crc32c", "read_events", "read_records"]
