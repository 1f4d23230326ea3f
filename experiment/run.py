"""One run directory, owned by this module: every path inside it, its lock, its config, tokenizer,
token streams, checkpoints, metrics and evaluation records.

    WORKDIR/config.json          the resolved config; written last when a run is created, so its
                                 presence means "a run lives here" (and nothing else does)
    WORKDIR/tokenizer.json       built from the train split once, shared by training and evaluation
    WORKDIR/streams/SPLIT.npy    token streams, cached once
    WORKDIR/checkpoints/         orbax (experiment/checkpoints.py)
    WORKDIR/metrics.jsonl        one line per logged training step, each step once
    WORKDIR/eval/extrapolation.json   evaluation records (experiment/records.py says what is one)
    WORKDIR/eval/attention.json, eval/passkey.json   attention diagnostics, passkey retrieval
    WORKDIR/tensorboard/         the same metrics and records as TensorBoard event files
    WORKDIR/init_from.json       the run this one started from, if any
    WORKDIR/.lock                held (flock) by the process that trains or evaluates here

The lock is an OS lock on an open file (flock), which the kernel drops when its process dies, so a
killed run leaves no stale lock; Linux's NFS client maps flock onto NFS byte-range locks, so it also
holds across hosts on a shared filesystem. Where a filesystem refuses locks, a lock file created
with O_EXCL stands in (its holder's host and pid are checked to recover it after a crash).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import json
import logging
import os
import pathlib
import shutil
import socket
import sys
import time
from typing import Callable

import numpy as np

import corpora
from experiment import checkpoints, config_util, records

log = logging.getLogger(__name__)


class RunError(config_util.ConfigError):
    """The run directory cannot be used as asked; the message says what to do."""


class WorkdirBusy(RunError):
    """Another process holds the run directory's lock."""


_HELD: dict[str, int] = {}  # lock path -> depth: this process already holds it (nested use)


class RunDir:
    """Paths and state of one run directory."""

    def __init__(self, workdir: str | pathlib.Path):
        self.path = pathlib.Path(workdir)
        if self.path.exists() and not self.path.is_dir():
            raise RunError(f"--workdir {self.path} is a file; give a folder (it is created if missing)")

    # --- layout ------------------------------------------------------------------------------
    @property
    def config_path(self) -> pathlib.Path:
        return self.path / "config.json"

    @property
    def tokenizer_path(self) -> pathlib.Path:
        return self.path / "tokenizer.json"

    @property
    def streams_dir(self) -> pathlib.Path:
        return self.path / "streams"

    def stream_path(self, split: str) -> pathlib.Path:
        return self.streams_dir / f"{split}.npy"

    @property
    def checkpoints_dir(self) -> pathlib.Path:
        return self.path / "checkpoints"

    @property
    def metrics_path(self) -> pathlib.Path:
        return self.path / "metrics.jsonl"

    @property
    def results_path(self) -> pathlib.Path:
        return self.path / "eval" / "extrapolation.json"

    @property
    def attention_path(self) -> pathlib.Path:
        """Attention diagnostics records (experiment/diagnostics.py)."""
        return self.path / "eval" / "attention.json"

    @property
    def passkey_path(self) -> pathlib.Path:
        """Passkey retrieval records (experiment/passkey.py)."""
        return self.path / "eval" / "passkey.json"

    @property
    def tensorboard_dir(self) -> pathlib.Path:
        """TensorBoard event files (experiment/tensorboard.py), a view of metrics.jsonl and the records."""
        return self.path / "tensorboard"

    @property
    def init_from_path(self) -> pathlib.Path:
        """Where a run started from another's parameters records that run (experiment/init_from.py)."""
        return self.path / "init_from.json"

    @property
    def lock_path(self) -> pathlib.Path:
        return self.path / ".lock"

    def exists(self) -> bool:
        """A run lives here (its config.json has been written)."""
        return self.config_path.exists()

    # --- lock --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, purpose: str):
        """Hold the run directory exclusively for `purpose` ('training', 'evaluation'); a second
        process gets WorkdirBusy at once, naming the holder. Re-entrant within one process."""
        self.path.mkdir(parents=True, exist_ok=True)
        key = str(self.lock_path.absolute())
        if key in _HELD:
            _HELD[key] += 1
            try:
                yield
            finally:
                _HELD[key] -= 1
            return
        release = _acquire(self.lock_path, purpose)
        _HELD[key] = 1
        try:
            yield
        finally:
            del _HELD[key]
            release()

    # --- config ------------------------------------------------------------------------------
    def load_config(self):
        self.require_run()
        return config_util.load_config(self.config_path)

    def check_config(self, config) -> None:
        """An existing run must have been made with `config` (up to RESUMABLE_KEYS)."""
        if not self.exists():
            return
        diffs = config_util.config_differences(config_util.read_saved_config(self.config_path), config.to_dict())
        if diffs:
            raise RunError(f"{self.path} holds a run with a different config ({'; '.join(diffs)}); "
                           f"use a new --workdir, or delete this one to start over")

    def clear_leftovers(self) -> None:
        """Before a run is created here: remove what an attempt that failed before writing
        config.json left behind (its tokenizer or streams may come from other data)."""
        if self.exists():
            return
        for target in (self.tokenizer_path, self.streams_dir, self.checkpoints_dir, self.metrics_path,
                       self.results_path.parent, self.tensorboard_dir, self.init_from_path):
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

    def save_config(self, config) -> None:
        config_util.save_config(config, self.config_path)

    def require_run(self) -> None:
        if not self.exists():
            raise RunError(f"{self.path} is not a run directory (no config.json); train first: "
                           f"python train.py --config configs/demo.py --workdir {self.path}")

    def require_checkpoint(self) -> None:
        self.require_run()
        if not self.checkpoints_dir.exists() or self.manager().latest_step() is None:
            raise RunError(f"{self.path} has no checkpoint yet; train first (the same train.py command "
                           f"resumes an interrupted run)")

    # --- tokenizer and streams ----------------------------------------------------------------
    def tokenizer(self, data_cfg, train_lines: Callable[[], list[str]] | None = None, *, write: bool = True):
        """The run's tokenizer: read from the run directory, or (`write`) built from the train split's
        lines (`train_lines()`, byte tokenizers need none) and saved there."""
        if self.tokenizer_path.exists():
            return corpora.load_tokenizer(self.tokenizer_path)
        if not write:
            raise RunError(f"{self.tokenizer_path} is missing; the run directory is incomplete (train again "
                           f"with the same command to rebuild it)")
        lines = train_lines() if data_cfg.tokenizer != "byte" and train_lines else None
        tokenizer = corpora.build_tokenizer(data_cfg.tokenizer, lines, data_cfg.get("vocab_size", 0))
        if write:
            corpora.save_tokenizer(tokenizer, self.tokenizer_path)
        return tokenizer

    def stream(self, data_cfg, split: str, tokenizer, lines: list[str] | None = None, *,
               write: bool = True) -> tuple[np.ndarray, int]:
        """(token stream, word count) of one split, encoded once and cached (streams/SPLIT.npy and
        .json; word-level encoding of a large split is slow in Python); training and evaluation
        share it. The word count is the denominator of word-level perplexity."""
        path = self.stream_path(split)
        meta = path.with_suffix(".json")
        if path.exists() and meta.exists():
            return np.load(path), int(json.loads(meta.read_text())["words"])
        if lines is None:
            lines = corpora.load_lines(data_cfg, split)
        stream, words = tokenizer.encode_lines(lines), corpora.count_words(lines)
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, stream)
            tmp.replace(path)
            meta.write_text(json.dumps({"words": words, "tokens": int(len(stream))}))
        return stream, words

    # --- checkpoints ---------------------------------------------------------------------------
    def manager(self):
        """One orbax manager per RunDir (it caches the list of steps)."""
        if getattr(self, "_manager", None) is None:
            self._manager = checkpoints.manager(self.path)
        return self._manager

    def latest_step(self) -> int | None:
        if not self.checkpoints_dir.exists():
            return None
        return self.manager().latest_step()

    def restore(self, params, opt_state=None, *, drop_damaged: bool = False, step: int | None = None):
        """(params, opt_state, meta) from the newest checkpoint that can be read: a damaged newer one
        is skipped with a warning (and deleted when `drop_damaged`, so that training can save that
        step again). If none can be read (or none fits the model), the newest one's error is raised."""
        mngr = self.manager()
        steps = sorted(mngr.all_steps(), reverse=True)
        if step is not None:
            if step not in steps:
                raise RunError(f"{self.checkpoints_dir} has no checkpoint at step {step}; it has {sorted(steps)}")
            steps = [step]
        failed: list[tuple[int, Exception]] = []
        for step in steps:
            try:
                with _quiet_abandoned_reads():
                    restored = checkpoints.restore(mngr, params, opt_state, step=step)
            except Exception as e:  # noqa: BLE001 - unreadable: try the one before
                failed.append((step, e))
                continue
            for bad, error in failed:
                log.warning("the checkpoint at step %d in %s cannot be read (%s); using step %d%s", bad,
                            self.checkpoints_dir, _first_line(error), step,
                            " and deleting the damaged one" if drop_damaged else "")
                if drop_damaged:
                    mngr.delete(bad)
            return restored
        if failed:
            raise failed[0][1]
        raise RunError(f"{self.path} has no checkpoint yet; train first")

    # --- metrics ---------------------------------------------------------------------------------
    def truncate_metrics(self, last_step: int) -> None:
        """Drop metrics logged after the checkpoint we resume from, so the log has each step once."""
        if not self.metrics_path.exists():
            return
        kept = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                if line.strip() and json.loads(line)["step"] <= last_step:
                    kept.append(line)
            except (ValueError, KeyError):  # a line cut short by a crash
                continue
        self.metrics_path.write_text("".join(line + "\n" for line in kept))

    # --- evaluation records ---------------------------------------------------------------------
    def read_records(self, path: pathlib.Path) -> list[dict]:
        """The records of one results file under eval/ ([] if none)."""
        if not path.exists():
            return []
        try:
            return json.loads(path.read_text())
        except ValueError as e:
            raise RunError(f"{path} is damaged ({e}); delete it and evaluate again") from e

    def add_records(self, path: pathlib.Path, new: list[dict], key=records.record_key) -> list[dict]:
        """Merge `new` records into `path` (experiment/records.py: same key replaces; older
        checkpoints' records are dropped with a warning); written atomically."""
        merged, stale = records.merge(self.read_records(path), new, key)
        if stale:
            log.warning("dropped %d record(s) of an older checkpoint (step %s) from %s; evaluate again to "
                        "have them for step %s", len(stale), sorted({r.get("step") for r in stale}), path,
                        new[0].get("step"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(merged, indent=1))
        tmp.replace(path)
        return merged

    def results(self) -> list[dict]:
        """The perplexity records (eval/extrapolation.json)."""
        return self.read_records(self.results_path)

    def add_results(self, new: list[dict]) -> list[dict]:
        return self.add_records(self.results_path, new)


@contextlib.contextmanager
def _quiet_abandoned_reads():
    """A failed orbax restore leaves its other reads' coroutines unawaited; Python would print each
    one's error with a page of TensorStore spec whenever they are collected (often much later).
    From the first failed restore on, those (and only those) are dropped quietly."""
    try:
        yield
    except Exception:
        if not getattr(sys.unraisablehook, "drops_orbax_reads", False):
            previous = sys.unraisablehook

            def hook(unraisable):
                code = getattr(unraisable.object, "cr_code", None)
                if code is None or "orbax" not in code.co_filename:
                    previous(unraisable)
            hook.drops_orbax_reads = True
            sys.unraisablehook = hook
        gc.collect()
        raise


def _first_line(error: BaseException | None) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200] if error else ""


def _holder(purpose: str) -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "purpose": purpose,
                       "since": time.strftime("%Y-%m-%d %H:%M:%S")})


def _describe(text: str) -> str:
    try:
        h = json.loads(text)
        return f"{h['purpose']} (pid {h['pid']} on {h['host']}, since {h['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"


def _acquire(lock_path: pathlib.Path, purpose: str):
    """Take the lock; returns the function that releases it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            raise WorkdirBusy(f"{lock_path.parent} is in use by {_describe(holder)}; wait for it to finish, "
                              f"or use another --workdir") from None
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            return _acquire_by_file(lock_path, purpose)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder(purpose).encode(), 0)

    def release():
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return release


def _acquire_by_file(lock_path: pathlib.Path, purpose: str):
    """For filesystems without locks: an O_EXCL file naming its holder, recovered when that holder
    (on this host) is no longer alive."""
    path = lock_path.with_name(".lock.owner")
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            text = path.read_text(errors="replace")
            try:
                holder = json.loads(text)
                stale = holder["host"] == socket.gethostname() and not _alive(int(holder["pid"]))
            except (ValueError, KeyError, TypeError):
                stale = False
            if stale:
                path.unlink(missing_ok=True)
                continue
            raise WorkdirBusy(f"{lock_path.parent} is in use by {_describe(text)}; wait for it to finish, "
                              f"or delete {path} if that process is gone") from None
        os.write(fd, _holder(purpose).encode())
        os.close(fd)
        return lambda: path.unlink(missing_ok=True)
    raise WorkdirBusy(f"could not take {path}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
