"""The first thing an entry point does, before the imports that load JAX: Ctrl-C or SIGTERM during those
seconds ends the command with rc 130 / 143 and one line, not a traceback from inside an import
(experiment/runtime/interrupts.py takes over once they are loaded). Standard library only, and so are
the packages above it (experiment/__init__.py, experiment/runtime/__init__.py import nothing)."""
from __future__ import annotations

import os
import signal
import sys


def catch_start_up_signals() -> None:
    def stop(signum, frame):
        print("interrupted during start-up; nothing was written", file=sys.stderr)
        os._exit(128 + signum)
    for signum in (signal.SIGINT, signal.SIGTERM):  # SIGTERM: kill, timeout, SLURM
        signal.signal(signum, stop)
