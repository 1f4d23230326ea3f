"""One run directory, owned by this module: every path inside it, its lock, its config, tokenizer,
token streams, checkpoints, metrics and evaluation records.

    WORKDIR/config.json          the resolved config, written once the config, data and model are
                                 checked; a run exists once it also has a checkpoint: before that,
                                 a command with another config replaces the attempt
    WORKDIR/tokenizer.json       built from the train split once, shared by training and evaluation
    WORKDIR/streams/SPLIT.npy    token streams, cached once
    WORKDIR/checkpoints/         orbax (experiment/store/checkpoints.py: saving and restoring; the
                                 steps there are read here from the folder's listing)
    WORKDIR/metrics.jsonl        one line per logged training step, each step once
    WORKDIR/eval/extrapolation.json   perplexity records (experiment/store/records.py: every kind of record)
    WORKDIR/eval/passkey.json, eval/attention.json   passkey retrieval, attention statistics
    WORKDIR/tensorboard/         the same metrics and records as TensorBoard event files
    WORKDIR/init_from.json       the run this one started from, if any
    WORKDIR/.lock                held (flock) by the process that trains or evaluates here

The lock (experiment/store/lock.py) is an OS lock that the kernel drops when its holder dies.

Every file read here is checked before it is trusted: a damaged one is reported by name with the
command that repairs it (RunError), or, for the token streams (a cache), encoded again
(experiment/store/files.py, records.py).

This module imports no JAX (reports and config files reach it): what needs orbax is in
checkpoints.py, and which process writes is asked of JAX only where JAX is loaded (`is_writer`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import re
import shlex
import shutil
import sys
from typing import Callable

import numpy as np

import corpora
from experiment import config as config_lib
from experiment.store import files, lock, records
from experiment.store.files import (checked_origin, checked_stream, first_line, save_array_atomically,
                                   write_atomically)

log = logging.getLogger(__name__)

STEP_FOLDER = re.compile(r"0|[1-9][0-9]*")  # orbax's name of a finished step; a step being written has a suffix


def is_writer() -> bool:
    """Whether this process writes the run folder's files: the first process of a job. A job of
    several processes exists only once JAX has started it (experiment/runtime/distributed.py), so
    where JAX is not loaded this process is the only one; otherwise JAX says which one it is."""
    jax = sys.modules.get("jax")
    return jax is None or jax.process_index() == 0


class RunError(config_lib.ConfigError):
    """The run directory cannot be used as asked; the message says what to do."""


WorkdirBusy = lock.WorkdirBusy

class RunDir:
    """Paths and state of one run directory. `writer`: whether this process writes its files (one
    process of a multi-process job does; `is_writer`). Open it for work with `opened(workdir,
    purpose)`, which takes the lock once and hands the object on."""

    def __init__(self, workdir: str | pathlib.Path, *, writer: bool | None = None):
        self.path = pathlib.Path(workdir)
        if self.path.exists() and not self.path.is_dir():
            raise RunError(f"--workdir {self.path} is a file; give a folder (it is created if missing)")
        self.writer = is_writer() if writer is None else writer
        self.held = False  # this object holds the lock (`locked`)
        self._config: config_lib.Config | None = None
        self.checkpoint_manager = None  # orbax's, made once by experiment/store/checkpoints.py

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
        """The file of one kind of evaluation record (experiment/store/records.py: perplexity, passkey, attention)."""
        return self.eval_dir / records.record_kind(kind).file

    @property
    def tensorboard_dir(self) -> pathlib.Path:
        """TensorBoard event files (experiment/store/tensorboard.py), a view of metrics.jsonl and the records."""
        return self.path / "tensorboard"

    @property
    def init_from_path(self) -> pathlib.Path:
        """Where a run started from another's parameters records that run (experiment/train/init_from.py)."""
        return self.path / "init_from.json"

    def exists(self) -> bool:
        """A run has been set up here (its config.json has been written)."""
        return self.config_path.exists()

    def has_checkpoint(self) -> bool:
        """A run lives here: it has a checkpoint, so its config can no longer change (RESUMABLE_KEYS aside)."""
        return self.latest_step() is not None

    # --- lock --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, purpose: str):
        """Hold the run directory exclusively for `purpose` ('training', 'evaluation'); a second
        process (or a second RunDir of this one) gets WorkdirBusy at once, naming the holder. Work
        that writes nothing leaves no folder behind (experiment/store/lock.py: holding)."""
        with lock.holding(self.path, purpose):
            self.held = True
            try:
                yield
            finally:
                self.held = False

    # --- config ------------------------------------------------------------------------------
    def load_config(self) -> config_lib.Config:
        """The run's config (read once per RunDir; the one this object saved, if it saved one),
        checked like any config: a damaged config.json is a RunError naming it."""
        if self._config is None:
            self.require_run()
            self._saved_config()  # its structure and the types of its values first
            try:
                config = config_lib.load_config(self.config_path)
                config_lib.check_domains(config)
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                raise self._damaged_config(e) from None
            self._config = config
        return self._config

    def _saved_config(self) -> dict | None:
        """config.json as a dict, None if there is none; a damaged one is a RunError."""
        if not self.exists():
            return None
        try:
            saved = config_lib.read_saved_config(self.config_path)
        except ValueError as e:
            raise self._damaged_config(e) from None
        problem = files.config_problem(saved)
        if problem:
            raise self._damaged_config(ValueError(problem))
        return saved

    def _damaged_config(self, error: Exception) -> RunError:
        detail = first_line(error)
        if not self.has_checkpoint():
            return RunError(f"{self.config_path} is damaged ({detail}); no checkpoint depends on it: the train.py "
                            f"command of this run writes it again")
        return RunError(f"{self.config_path} is damaged ({detail}); it describes the checkpoints in "
                        f"{self.checkpoints_dir} and cannot be rebuilt from them: put back a copy of it, or delete "
                        f"{self.path} and train again (python train.py --config ... --workdir {self.path})")

    def check_config(self, config) -> None:
        """A run with a checkpoint must be resumed with its own config (up to RESUMABLE_KEYS);
        before its first checkpoint, any config replaces the attempt (`clear_leftovers`)."""
        if not self.has_checkpoint():
            return
        self.load_config()  # a damaged config.json is named, not compared
        diffs = config_lib.config_differences(self._saved_config() or {}, config.to_dict())
        if diffs:
            raise RunError(f"{self.path} holds a run with a different config ({'; '.join(diffs)}); "
                           f"use a new --workdir, or delete this one to start over")

    def clear_leftovers(self, config) -> None:
        """Before a run's first checkpoint: remove what an earlier attempt left (metrics, records,
        TensorBoard files, an empty checkpoints folder, init_from.json; and its config.json,
        tokenizer and token streams unless that attempt read the same data with the same
        tokenizer), so that the corrected command starts clean."""
        if self.has_checkpoint():
            return
        try:
            saved = self._saved_config()
        except RunError:
            saved = None  # a damaged config.json: nothing of the attempt is kept
        new = config.to_dict()
        same_data = (saved is not None and isinstance(saved.get("data"), dict)
                     and not config_lib.config_differences({"data": saved["data"]}, {"data": new["data"]})
                     and (saved.get("train") or {}).get("init_from") == new["train"]["init_from"])
        targets = [self.checkpoints_dir, self.metrics_path, self.eval_dir, self.tensorboard_dir, self.init_from_path]
        if not same_data:
            targets += [self.config_path, self.tokenizer_path, self.streams_dir]
        for target in targets:
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        self.checkpoint_manager = None

    def save_config(self, config: config_lib.Config) -> None:
        config_lib.save_config(config, self.config_path)
        self._config = config

    def require_run(self) -> None:
        if not self.exists():
            raise RunError(f"{self.path} is not a run directory (no config.json); train first: "
                           f"python train.py --config configs/demo.py --workdir {self.path}")

    def require_checkpoint(self) -> None:
        self.require_run()
        if self.latest_step() is None:
            raise RunError(f"{self.path} has no checkpoint yet; train first (the same train.py command "
                           f"resumes an interrupted run)")

    # --- tokenizer and streams ----------------------------------------------------------------
    def tokenizer(self, data_cfg, train_lines: Callable[[], list[str]] | None = None, *, write: bool = True):
        """The run's tokenizer: read from the run directory, or (`write`) built from the train split's
        lines (`train_lines()`, byte tokenizers need none) and saved there."""
        if self.tokenizer_path.exists():
            try:
                return corpora.load_tokenizer(self.tokenizer_path)
            except Exception as e:  # noqa: BLE001 - JSON, keys, the tokenizers library: all mean damaged
                raise RunError(f"{self.tokenizer_path} is damaged ({first_line(e)}); "
                               f"{self._tokenizer_repair(data_cfg)}") from None
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
            try:
                return checked_stream(path, meta, tokenizer.vocab_size)
            except ValueError as e:
                if not write:
                    raise RunError(f"{path} is damaged ({e}); delete it and {meta.name} beside it: the next "
                                   f"evaluation or train.py command encodes the {split} split again") from None
                log.warning("%s is damaged (%s); encoding the %s split again", path, e, split)
        if lines is None:
            try:
                lines = corpora.load_lines(data_cfg, split)
            except corpora.DataError as e:
                raise self._data_error(e, data_cfg) if self.has_checkpoint() else e from None
        stream, words = tokenizer.encode_lines(lines), corpora.count_words(lines)
        past = int(np.max(stream)) if len(stream) else -1
        if past >= tokenizer.vocab_size:  # a lookup past the embedding gives NaN: a record of nothing measured
            raise RunError(f"the {split} split encodes to token id {past:,}, past the model's vocabulary of "
                           f"{tokenizer.vocab_size:,}: the tokenizer ({self.tokenizer_path}) does not fit the model; "
                           f"give the checkpoint's own tokenizer (import_hf.py --tokenizer)")
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_array_atomically(path, np.asarray(stream))
            write_atomically(meta, json.dumps({"words": words, "tokens": int(len(stream))}))
        return stream, words

    def _data_error(self, error: Exception, data_cfg) -> corpora.DataError:
        """A run's data that cannot be read any more (moved, or imported with a wrong --data_path):
        the fix is in its config.json, which evaluation reads (it has no --config flags)."""
        what = re.sub(r"--config\.data\.(\w+)", r"data.\1", str(error))
        again = (", or import the checkpoint again into a new folder: python import_hf.py CHECKPOINT --workdir NEW "
                 "--data_path FOLDER" if data_cfg.tokenizer == "pretrained" else "")
        return corpora.DataError(f"{what}; this run reads its data as the data section of {self.config_path} says: "
                                 f"edit data.path (and data.source) there{again}")

    def _tokenizer_repair(self, data_cfg) -> str:
        """How to put back a damaged tokenizer.json: from where the run's tokenizer came."""
        base = self._config.train.init_from if self._config is not None else ""
        if data_cfg.tokenizer == "pretrained":
            return ("it came with the imported checkpoint: import it again (python import_hf.py CHECKPOINT "
                    "--workdir NEW)")
        if base:
            return f"it came from the run this one started from: cp {base}/tokenizer.json {self.tokenizer_path}"
        return ("delete it and run this run's train.py command again: it is rebuilt from the train split (a "
                "vocabulary that does not fit the checkpoint is refused)")

    # --- checkpoints (their steps; saving and restoring: experiment/store/checkpoints.py) -------
    def steps(self) -> list[int]:
        """The steps of the finished checkpoints, oldest first: folders named by their step (orbax
        writes a step under another name and renames it once it is complete)."""
        if not self.checkpoints_dir.is_dir():
            return []
        return sorted(int(p.name) for p in self.checkpoints_dir.iterdir()
                      if STEP_FOLDER.fullmatch(p.name) and p.is_dir())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    # --- metrics ---------------------------------------------------------------------------------
    def truncate_metrics(self, last_step: int) -> None:
        """Drop metrics logged after the checkpoint we resume from, so the log has each step once."""
        if not self.metrics_path.exists():
            return
        kept, damaged = [], []
        lines = self.metrics_path.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            step = files.metrics_step(line)
            if step is None:
                if line.strip() and number < len(lines):  # the last line may be cut short by a crash
                    damaged.append(number)
                continue
            if step <= last_step:
                kept.append(line)
        if damaged:
            log.warning("%s: dropped %d damaged line(s) (not a JSON object with an integer step: line %s)",
                        self.metrics_path, len(damaged), ", ".join(map(str, damaged[:10])))
        write_atomically(self.metrics_path, "".join(line + "\n" for line in kept))

    # --- evaluation records ---------------------------------------------------------------------
    def records(self, kind: str) -> list[dict]:
        """The records of one kind (experiment/store/records.py) in eval/ ([] if none)."""
        path = self.records_path(kind)
        if not path.exists():
            return []
        try:
            data = json.loads(path.read_text())
        except (ValueError, OSError) as e:
            problem = first_line(e)
        else:
            problem = records.problem(kind, data)
        if problem:
            raise RunError(f"{path} is damaged ({problem}); delete it and evaluate again: rm {'-r ' * path.is_dir()}"
                           f"{shlex.quote(str(path))}; python eval_extrapolate.py --workdir "
                           f"{shlex.quote(str(self.path))}" + (f" {records.record_kind(kind).flag}"
                                                                 if records.record_kind(kind).flag else ""))
        return data

    def add_records(self, kind: str, new: list[dict]) -> list[dict]:
        """Merge `new` records of one kind into its file (experiment/store/records.py: same key replaces;
        older checkpoints' records are dropped with a warning); written atomically."""
        path = self.records_path(kind)
        merged, stale = records.merge(self.records(kind), new, records.record_kind(kind).key)
        if stale:
            log.warning("dropped %d record(s) of an older checkpoint (step %s) from %s; evaluate again to "
                        "have them for step %s", len(stale), sorted({r.get("step") for r in stale}), path,
                        new[0].get("step"))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(merged, indent=1))
        return merged

    # --- origin ----------------------------------------------------------------------------------
    def origin(self) -> dict | None:
        """The run this one started from ({workdir, step, scheme, train_length}), if any."""
        if not self.init_from_path.exists():
            return None
        try:
            origin = checked_origin(self.init_from_path)
        except ValueError as e:
            raise RunError(f"{self.init_from_path} is damaged ({first_line(e)}); it only labels where the run "
                           f"started (reports show 'from base@step'): delete it (rm {self.init_from_path}) and the "
                           f"run is shown without its origin") from None
        return origin

    def record_origin(self, origin: dict) -> None:
        write_atomically(self.init_from_path, json.dumps(origin, indent=1))


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
