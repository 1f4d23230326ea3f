"""One run directory, owned by this module: every path inside it, its lock, its config, tokenizer,
token streams, checkpoints, metrics and evaluation records.

    WORKDIR/config.json          the resolved config; written last when a run is created, so its
                                 presence means "a run lives here" (and nothing else does)
    WORKDIR/tokenizer.json       built from the train split once, shared by training and evaluation
    WORKDIR/streams/SPLIT.npy    token streams, cached once
    WORKDIR/checkpoints/         orbax (experiment/checkpoints.py)
    WORKDIR/metrics.jsonl        one line per logged training step, each step once
    WORKDIR/eval/extrapolation.json   perplexity records (experiment/records.py: every kind of record)
    WORKDIR/eval/passkey.json, eval/attention.json   passkey retrieval, attention statistics
    WORKDIR/tensorboard/         the same metrics and records as TensorBoard event files
    WORKDIR/init_from.json       the run this one started from, if any
    WORKDIR/.lock                held (flock) by the process that trains or evaluates here

The lock (experiment/lock.py) is an OS lock that the kernel drops when its holder dies. Every file
read here is checked before use (experiment/run_files.py, records.py): a damaged one is refused by
name, with what is wrong and the command that repairs it.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import pathlib
import shlex
import shutil
import sys
from typing import Callable

import numpy as np

import corpora
import posenc
from experiment import checkpoints, config as config_lib, lock, records, run_files
from experiment.runtime import distributed

log = logging.getLogger(__name__)


class RunError(config_lib.ConfigError):
    """The run directory cannot be used as asked; the message says what to do."""


WorkdirBusy = lock.WorkdirBusy

class RunDir:
    """Paths and state of one run directory. `writer`: whether this process writes its files (one
    process of a multi-process job does; experiment/runtime/distributed.py). Open it for work with
    `opened(workdir, purpose)`, which takes the lock once and hands the object on."""

    def __init__(self, workdir: str | pathlib.Path, *, writer: bool | None = None):
        self.path = pathlib.Path(workdir)
        if self.path.exists() and not self.path.is_dir():
            raise RunError(f"--workdir {self.path} is a file; give a folder (it is created if missing)")
        self.writer = distributed.is_writer() if writer is None else writer
        self.held = False  # this object holds the lock (`locked`)
        self._config: config_lib.Config | None = None

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
    def eval_dir(self) -> pathlib.Path:
        return self.path / "eval"

    def records_path(self, kind: str) -> pathlib.Path:
        """The file of one kind of evaluation record (experiment/records.py: perplexity, passkey, attention)."""
        return self.eval_dir / records.record_kind(kind).file

    @property
    def tensorboard_dir(self) -> pathlib.Path:
        """TensorBoard event files (experiment/tensorboard.py), a view of metrics.jsonl and the records."""
        return self.path / "tensorboard"

    @property
    def init_from_path(self) -> pathlib.Path:
        """Where a run started from another's parameters records that run (experiment/train/init_from.py)."""
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
        process (or a second RunDir of this one) gets WorkdirBusy at once, naming the holder."""
        self.path.mkdir(parents=True, exist_ok=True)
        release = lock.acquire(self.lock_path, purpose)
        self.held = True
        try:
            yield
        finally:
            self.held = False
            release()

    # --- config ------------------------------------------------------------------------------
    def load_config(self) -> config_lib.Config:
        """The run's config (read once per RunDir; the one this object saved, if it saved one),
        checked: a damaged config.json is refused by name (`config_damaged`)."""
        if self._config is None:
            self.require_run()
            self.saved_config()
            try:
                config = config_lib.load_config(self.config_path)
                posenc.get(config.posenc.name)
            except (ValueError, TypeError) as e:
                raise self.config_damaged(_first_line(e)) from None
            self._config = config
        return self._config

    def saved_config(self) -> dict:
        """config.json as saved: a JSON object with a data, model, train and posenc section whose
        values have their defaults' types; else RunError (`config_damaged`)."""
        try:
            saved = json.loads(self.config_path.read_text())
        except (ValueError, OSError) as e:
            raise self.config_damaged(_first_line(e)) from None
        problem = run_files.config_problem(saved)
        if problem:
            raise self.config_damaged(problem)
        return saved

    def config_damaged(self, problem: str) -> RunError:
        return RunError(f"{self.config_path} is damaged ({problem}); it is the config this run was trained with "
                        f"and no other file holds it: restore it from a copy, or train again in a new folder "
                        f"(python train.py --config CONFIG --workdir NEW_FOLDER)")

    def check_config(self, config) -> None:
        """An existing run must have been made with `config` (up to RESUMABLE_KEYS)."""
        if not self.exists():
            return
        self.saved_config()
        diffs = config_lib.config_differences(config_lib.read_saved_config(self.config_path), config.to_dict())
        if diffs:
            raise RunError(f"{self.path} holds a run with a different config ({'; '.join(diffs)}); "
                           f"use a new --workdir, or delete this one to start over")

    def clear_leftovers(self) -> None:
        """Before a run is created here: remove what an attempt that failed before writing
        config.json left behind (its tokenizer or streams may come from other data)."""
        if self.exists():
            return
        for target in (self.tokenizer_path, self.streams_dir, self.checkpoints_dir, self.metrics_path,
                       self.eval_dir, self.tensorboard_dir, self.init_from_path):
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

    def save_config(self, config: config_lib.Config) -> None:
        config_lib.save_config(config, self.config_path)
        self._config = config

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
        tokenizer = corpora.build_tokenizer(data_cfg.tokenizer, lines, data_cfg.vocab_size)
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
        kept, damaged = [], []
        lines = self.metrics_path.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            step = run_files.metrics_step(line)
            if step is None:
                if line.strip() and number < len(lines):  # the last line may be cut short by a crash
                    damaged.append(number)
                continue
            if step <= last_step:
                kept.append(line)
        if damaged:
            log.warning("%s: dropped %d damaged line(s) (not a JSON object with an integer step: line %s)",
                        self.metrics_path, len(damaged), ", ".join(map(str, damaged[:10])))
        self.metrics_path.write_text("".join(line + "\n" for line in kept))

    # --- evaluation records ---------------------------------------------------------------------
    def records(self, kind: str) -> list[dict]:
        """The records of one kind (experiment/records.py) in eval/ ([] if none)."""
        path = self.records_path(kind)
        if not path.exists():
            return []
        try:
            data = json.loads(path.read_text())
        except (ValueError, OSError) as e:
            problem = _first_line(e)
        else:
            problem = records.problem(kind, data)
        if problem:
            raise RunError(f"{path} is damaged ({problem}); delete it and evaluate again: rm {'-r ' * path.is_dir()}"
                           f"{shlex.quote(str(path))}; python eval_extrapolate.py --workdir "
                           f"{shlex.quote(str(self.path))}" + (f" {records.record_kind(kind).flag}"
                                                                 if records.record_kind(kind).flag else ""))
        return data

    def add_records(self, kind: str, new: list[dict]) -> list[dict]:
        """Merge `new` records of one kind into its file (experiment/records.py: same key replaces;
        older checkpoints' records are dropped with a warning); written atomically."""
        path = self.records_path(kind)
        merged, stale = records.merge(self.records(kind), new, records.record_kind(kind).key)
        if stale:
            log.warning("dropped %d record(s) of an older checkpoint (step %s) from %s; evaluate again to "
                        "have them for step %s", len(stale), sorted({r.get("step") for r in stale}), path,
                        new[0].get("step"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(merged, indent=1))
        tmp.replace(path)
        return merged

    # --- origin ----------------------------------------------------------------------------------
    def origin(self) -> dict | None:
        """The run this one started from ({workdir, step, scheme, train_length}), if any; a damaged
        init_from.json is refused by name, with what to write there."""
        path = self.init_from_path
        if not path.exists():
            return None
        try:
            origin = json.loads(path.read_text())
        except (ValueError, OSError) as e:
            problem = _first_line(e)
        else:
            problem = run_files.origin_problem(origin)
        if problem:
            base = self.load_config().train.init_from or "BASE_FOLDER"
            raise RunError(f"{path} is damaged ({problem}); it names the run this one started from: write it again "
                           f"(echo '{{\"workdir\": \"{base}\", \"step\": STEP}}' > {shlex.quote(str(path))}, "
                           f"STEP = the base's checkpoint step it started from) or delete it (rm "
                           f"{shlex.quote(str(path))}; the run is then shown without its origin)")
        return origin

    def record_origin(self, origin: dict) -> None:
        self.init_from_path.write_text(json.dumps(origin, indent=1))


@contextlib.contextmanager
def opened(workdir: "str | pathlib.Path | RunDir", purpose: str):
    """The run directory for work (`purpose`: 'training', 'evaluation'): the writing process takes
    its lock, once, for the whole block; the other processes of a job read. A RunDir that is already
    held is handed through, so a step that opens the run (evaluation after training) runs inside
    the caller's hold."""
    run = workdir if isinstance(workdir, RunDir) else RunDir(workdir)
    if run.held or not run.writer:
        yield run
        return
    with run.locked(purpose):
        yield run


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

