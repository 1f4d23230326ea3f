"""Ctrl-C (SIGINT) at any moment: the command stops at the next safe point with rc 130 and a line
that says what is saved, and nothing is left half-written. SIGTERM (what `kill`, `timeout`, SLURM
and `docker stop` send) is handled the same way and ends with rc 143; below, "Ctrl-C" stands for
either, and a second of either stops at once.

Why deferred: Python raises KeyboardInterrupt wherever the main thread happens to be, which may be
inside JAX's tracing and lowering (MLIR state left half-built: a segmentation fault at exit), in a
finaliser (where the exception is printed and swallowed, and the run trains on), or inside a
checkpoint write. So while `deferred()` is on (the entry points turn it on for the whole command,
experiment/cli.py; the training loop for its steps), the first Ctrl-C only records the request and
`check(saved)` raises `Interrupted(saved)` at the safe points: between set-up phases, after the
step is compiled, between steps, after a checkpoint is written, between evaluation batches and
lengths, between the runs of a sweep. Where stopping at once is harmless (reading data, encoding
tokens: every file written there is replaced atomically), `immediate(saved)` makes the first
Ctrl-C raise at once. A second Ctrl-C always stops at once (os._exit(128 + signal)): the files are then as
a `kill` would leave them, which every reader handles (the newest complete checkpoint resumes).
A Ctrl-C that would raise inside a garbage-collection callback (JAX runs one at every collection),
a finaliser or a weak-reference callback, where Python prints the exception in 7 lines and drops
it, is delivered again a moment later, outside.

In a job of several processes a Ctrl-C may reach only some of them; the training loop's processes
agree on it every few steps (experiment/train/loop.py: _stop_requested) and stop at one step with
one checkpoint. The other safe points (start-up, evaluation, a sweep's runs) are not agreed yet:
there, stop a multi-process job with a Ctrl-C to every process (a terminal's process group, scancel).

Before this module is imported (the seconds in which an entry point imports JAX), each entry point
sets a handler first thing (experiment/runtime/early.py): Ctrl-C there ends with rc 130 and one line,
not a traceback from inside an import.
"""
from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import weakref
import _weakrefset
from typing import Callable

EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C
SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}  # handled alike; rc 128 + the signal's number


class Interrupted(KeyboardInterrupt):
    """Ctrl-C took effect at a safe point; `saved` says what is on disk and how to go on."""

    def __init__(self, saved: str):
        super().__init__(saved)
        self.saved = saved


SECOND = ("every file is as a kill leaves it (the newest complete checkpoint and records are kept): the same "
          "command goes on from there")  # what a second Ctrl-C leaves, unless the command says otherwise
_state = {"on": False, "requested": False, "immediate": None, "exit_on_second": False, "signal": signal.SIGINT,
          "second": SECOND}


def exit_code() -> int:
    """The exit status of a command stopped by the signal received: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + int(_state["signal"])


def _exit_at_once(signum: int) -> None:
    sys.stderr.write(f"second {SIGNALS.get(signum, 'signal')}: stopped at once; {_state['second']}\n")
    sys.stderr.flush()
    os._exit(128 + int(signum))


_collecting = {"now": False}  # a garbage collection is running (the callback below, in gc.callbacks)
_WEAKREF_FILES = {weakref.__file__, _weakrefset.__file__}


def _track_collection(phase: str, info: dict) -> None:
    _collecting["now"] = phase == "start"


def _swallowed_here(frame) -> bool:
    """Whether an exception raised in `frame` would be printed and dropped instead of stopping the
    command: during a garbage collection (its callbacks, such as JAX's _xla_gc_callback, and the
    finalisers and weak-reference callbacks it runs), in a finaliser (__del__) or in a callback of
    the weakref module (WeakKeyDictionary's remove, ...)."""
    if _collecting["now"]:
        return True
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code.co_name == "__del__" or code.co_filename in _WEAKREF_FILES:
            return True
        frame = frame.f_back
    return False


def _again_soon(signum: int) -> None:
    """Deliver `signum` again in a moment, once the main thread has left the callback it is in."""
    timer = threading.Timer(0.01, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def _handler(signum, frame):
    second = _state["requested"]
    if second and _state["exit_on_second"]:
        _exit_at_once(signum)
    if (second or _state["immediate"] is not None) and _swallowed_here(frame):
        _again_soon(signum)  # raised here it would be printed (7 lines) and dropped: the same Ctrl-C, once out
        return
    if second:
        raise KeyboardInterrupt  # a library call (a notebook): stop at once, the process lives on
    _state.update(requested=True, signal=signum)
    if _state["immediate"] is not None:
        raise Interrupted(_state["immediate"])
    name = SIGNALS.get(signum, "signal")
    sys.stderr.write(f"\n{name}: stopping at the next safe point (after the current step, compilation or write); "
                     f"{name} again to stop at once\n")
    sys.stderr.flush()


@contextlib.contextmanager
def deferred(*, exit_on_second: bool = False, second: str = SECOND):
    """Ctrl-C and SIGTERM are recorded, not raised, inside this block (see the module docstring);
    nested blocks and other threads than the main one change nothing. A second one raises
    KeyboardInterrupt at once, or with `exit_on_second` (the entry points) ends the process with a
    line that says `second` (what the command leaves: by default files as a kill leaves them)."""
    if _state["on"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _handler) for signum in SIGNALS}
    _state.update(on=True, requested=False, immediate=None, exit_on_second=exit_on_second, signal=signal.SIGINT,
                  second=second)
    gc.callbacks.append(_track_collection)
    try:
        yield
    finally:
        gc.callbacks.remove(_track_collection)
        _collecting["now"] = False
        for signum, handler in previous.items():
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, handler if handler is not None else default)
        _state.update(on=False, requested=False, immediate=None, exit_on_second=False, signal=signal.SIGINT,
                      second=SECOND)


@contextlib.contextmanager
def immediate(saved: str):
    """Inside a `deferred()` block: the first Ctrl-C raises Interrupted(saved) at once (for work
    that writes nothing, or only files replaced atomically). A request made before is raised on entry."""
    check(saved)
    outer = _state["immediate"]
    _state["immediate"] = saved
    try:
        yield
    finally:
        _state["immediate"] = outer


def requested() -> bool:
    return _state["requested"]


def check(saved: str | Callable[[], str]) -> None:
    """At a safe point: raise Interrupted if Ctrl-C was pressed; `saved` (or what it returns) says
    what is on disk and what the same command will do."""
    if _state["requested"]:
        raise Interrupted(saved() if callable(saved) else saved)
