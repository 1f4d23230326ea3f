"""TensorBoard scalar event files, written with tensorboardX (no TensorFlow, no TensorBoard).

A run's metrics.jsonl stays the source of truth; these files only let TensorBoard plot the same
numbers (`tensorboard --logdir WORKDIR`).

tensorboardX builds the `Event`/`Summary` protocol buffers and frames them as TFRecords (CRC-32C
checksums included). Its `tensorboardX.RecordWriter` is used rather than its `SummaryWriter`, which
queues events to a background thread (a `flush()` there does not wait for the queue; a dead thread
leaves writers blocked) and rewrites tags with characters outside `[-/\\w.]` ('=' in
'eval/valid/ppl_L64_scale=4'). Here every event is written and flushed (fsync) in the caller, and
tags are kept as given.
"""
from __future__ import annotations

import itertools
import os
import pathlib
import shlex
import socket
import threading
import time
from collections.abc import Mapping

import tensorboardX
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary

FILE_VERSION = "brain.Event:2"

_file_counter = itertools.count()


class EventWriter:
    """Appends scalar summaries to one new event file in `logdir`.

    The file is `events.out.tfevents.<time>.<hostname>.<pid>.<n>` (TensorFlow's naming; n counts
    the writers of this process), never one that exists already. Its first event is
    `file_version = "brain.Event:2"`. Each `scalars()` call is one event, flushed to disk before it
    returns. Values are stored as float32 (simple_value): beyond its range they become +-inf, NaN
    stays NaN. A file where the folder belongs is refused by name (ValueError: what to delete). Use
    as a context manager, or call `close()`; writing after `close()` raises ValueError.
    """

    def __init__(self, logdir: str | os.PathLike):
        self.logdir = pathlib.Path(logdir)
        if self.logdir.exists() and not self.logdir.is_dir():
            raise ValueError(f"{self.logdir} is damaged (a file where the folder of TensorBoard's event files "
                             f"belongs); they only mirror metrics.jsonl and eval/: delete it (rm "
                             f"{shlex.quote(str(self.logdir))}) and run the command again")
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        now = time.time()
        while True:  # claim a name nobody uses (RecordWriter opens with "wb")
            self.path = self.logdir / (f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}."
                                       f"{os.getpid()}.{next(_file_counter)}")
            try:
                open(self.path, "xb").close()
                break
            except FileExistsError:
                continue
        self._records = tensorboardX.RecordWriter(str(self.path))
        self._write(Event(wall_time=now, file_version=FILE_VERSION))

    def _write(self, event: Event) -> None:
        with self._lock:
            if self._records is None:
                raise ValueError(f"EventWriter for {self.path} is closed")
            self._records.write(event.SerializeToString())
            self._records.flush()

    def scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Write one scalar (stored as float32) at `step`; wall_time defaults to now."""
        self.scalars({tag: value}, step, wall_time)

    def scalars(self, values: Mapping[str, float], step: int, wall_time: float | None = None) -> None:
        """Write several scalars at `step` as one event; nothing when `values` is empty.
        Values must convert with float(); they are stored as float32."""
        if not values:
            return
        summary = Summary(value=[Summary.Value(tag=str(tag), simple_value=float(value))
                                 for tag, value in values.items()])
        self._write(Event(wall_time=time.time() if wall_time is None else wall_time, step=int(step),
                          summary=summary))

    def restart(self, step: int, wall_time: float | None = None) -> None:
        """Mark a resumed run: TensorBoard drops every event of step >= `step` that files read before
        this one hold (SessionLog START, as TensorFlow's supervisor wrote; tensorboardX's
        `purge_step`), so steps logged after a checkpoint and abandoned when training resumed from
        it show once, with the values of the resumed run. TensorBoard's Python reader honours it for
        every tag; its Rust data server (`--load_fast`) instead drops a tag's later steps when the
        tag is written again at an earlier step, which a resumed run does."""
        self._write(Event(wall_time=time.time() if wall_time is None else wall_time, step=int(step),
                          session_log=SessionLog(status=SessionLog.START)))

    def flush(self) -> None:
        """Push what was written to disk (every write already does; kept for callers that ask)."""
        with self._lock:
            if self._records is not None:
                self._records.flush()

    def close(self) -> None:
        """Flush and close the file; further writes raise ValueError. Closing twice is harmless."""
        with self._lock:
            if self._records is None:
                return
            try:
                self._records.flush()
            finally:
                self._records.close()
                self._records = None

    @property
    def closed(self) -> bool:
        return self._records is None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["EventWriter", "FILE_VERSION"]
