"""Progress of long work where people look: a bar in a terminal (tqdm), and where there is none (a
batch job's log) a line every minute with what is done and about how long is left, so that a log of
an evaluation that takes an hour shows it moving; while one item takes longer than a minute (a
16k-token forward pass of a real model on a CPU), a line a minute says so. Training has its own
lines (train/metrics.py)."""
from __future__ import annotations

import logging
import threading
import time

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

EVERY_S = 60.0  # seconds between two log lines


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class Progress:
    """`with Progress(desc, total, unit) as p: ... p.update()` after each of `total` items.
    `shown=False` (a process that does not write: the others of a job) shows nothing."""

    def __init__(self, desc: str, total: int, unit: str, *, shown: bool = True, every_s: float | None = None):
        self.desc, self.total, self.unit = desc, total, unit
        self.every_s = EVERY_S if every_s is None else every_s
        self.bar = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False,
                        disable=None if shown else True)
        self.lines = shown and self.bar.disable  # no terminal: log lines instead of the bar
        self.done, self.start = 0, time.perf_counter()
        self.last = self.start
        self._closed = threading.Event()
        self._lock = threading.Lock()
        if self.lines and self.every_s > 0:  # a line a minute while one item is still being worked on
            threading.Thread(target=self._heartbeat, daemon=True).start()

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        with self._lock:
            self.done += n
            now = time.perf_counter()
            if self.lines and now - self.last >= self.every_s and self.done < self.total:
                self.last = now
                elapsed = now - self.start
                left = elapsed / self.done * (self.total - self.done)
                log.info("%s: %d of %d %s (%d%%), %s so far, about %s left", self.desc, self.done, self.total,
                         self.unit, 100 * self.done // self.total, _minutes(elapsed), _minutes(left))

    def _heartbeat(self) -> None:
        while not self._closed.wait(self.every_s / 4):
            with self._lock:
                now = time.perf_counter()
                if now - self.last >= self.every_s and not self._closed.is_set():
                    self.last = now
                    log.info("%s: %d of %d %s done, %s so far; working on the next", self.desc, self.done,
                             self.total, self.unit, _minutes(now - self.start))

    def close(self) -> None:
        self._closed.set()
        self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
