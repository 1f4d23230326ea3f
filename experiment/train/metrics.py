"""What training reports while it runs: one record per `train.log_every` steps, to metrics.jsonl
(the source of truth), TensorBoard, the progress bar, and, without a terminal (nohup, batch
schedulers), a plain log line."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from experiment.config import ConfigError
from experiment.runtime import accelerator
from experiment.store.run import RunDir
from experiment.store.tensorboard import EventWriter
from experiment.train.optimizer import lr_at

log = logging.getLogger(__name__)


class TrainingDiverged(ConfigError):
    """The loss or the gradient became infinite or NaN: the learning rate (or its warm-up) is too
    high for the model; the message says which value and step."""


@dataclasses.dataclass(frozen=True)
class Throughput:
    """What turns a step count into tokens/s and model-FLOPs utilisation."""
    tokens_per_step: int
    flops_per_token: float
    peak_tflops: float | None  # per device; None where unknown (CPU): no mfu
    devices: int
    attention: str = ""  # the attention path the compiled step runs (models/attention/choice.picked)


class MetricsLog:
    """Collects each step's metrics and writes one record every `log()`; a context manager that
    opens (on the writing process) metrics.jsonl and the TensorBoard file."""

    def __init__(self, run: RunDir, config, start: int, throughput: Throughput):
        self.run, self.train_cfg, self.throughput, self.start = run, config.train, throughput, start
        self.pending, self.last = [], time.perf_counter()
        self.bar = tqdm(total=config.train.steps, initial=start, desc=f"train {config.posenc.name} "
                        f"L={config.train.seq_len}", unit="step", dynamic_ncols=True,
                        disable=None if run.writer else True)
        self.plain_lines = run.writer and self.bar.disable  # no terminal: the loss goes to the log
        self._files = contextlib.ExitStack()
        self.file = self.board = None

    def __enter__(self):
        if self.run.writer:
            self.file = self._files.enter_context(open(self.run.metrics_path, "a"))
            self.board = self._files.enter_context(EventWriter(self.run.tensorboard_dir))
            self.board.restart(self.start + 1)  # steps after the checkpoint resumed from were abandoned
        return self

    def __exit__(self, *exc):
        self.bar.close()
        self._files.close()
        return False

    def add(self, metrics) -> None:
        """One step's metrics (device arrays, read when the next record is written)."""
        self.pending.append(metrics)
        self.bar.update(1)

    def log(self, step: int) -> None:
        """Write the metrics of the steps since the last record (one record, at `step`)."""
        values, now, tp = jax.device_get(self.pending), time.perf_counter(), self.throughput
        tokens_per_s = len(values) * tp.tokens_per_step / (now - self.last)
        memory_key, memory_gb = accelerator.peak_memory_gb()
        record = {"step": step,
                  "loss": float(np.mean([m["loss"] for m in values])),
                  "grad_norm": float(np.mean([m["grad_norm"] for m in values])),
                  "lr": lr_at(self.train_cfg, step - 1),
                  "tokens_per_s": tokens_per_s,
                  **({"mfu": tp.flops_per_token * tokens_per_s / (tp.peak_tflops * 1e12 * tp.devices)}
                     if tp.peak_tflops else {}),
                  memory_key: round(memory_gb, 3),
                  **({"attention": tp.attention} if tp.attention else {})}
        if self.run.writer:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
            self.board.scalars({f"train/{k}": v for k, v in record.items() if k not in ("step", "attention")}, step)
        mfu = record.get("mfu")
        self.bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{tokens_per_s:.0f}",
                             **({"mfu": f"{mfu:.1%}"} if mfu else {}), mem=f"{memory_gb:.1f}GB")
        if self.plain_lines:
            log.info("step %d/%d  loss %.4f  lr %.3g  %.0f tokens/s%s  %.2f GB", step, self.train_cfg.steps,
                     record["loss"], record["lr"], tokens_per_s, f"  mfu {mfu:.1%}" if mfu else "", memory_gb)
        self.pending, self.last = [], now
        self._refuse_non_finite(values, step)

    def check_finite(self, step: int) -> None:
        """Before a checkpoint: the steps since the last record kept the loss and gradient finite."""
        self._refuse_non_finite(jax.device_get(self.pending), step)

    def _refuse_non_finite(self, values: list, step: int) -> None:
        for name in ("loss", "grad_norm"):
            bad = [float(m[name]) for m in values if not np.isfinite(m[name])]
            if bad:
                raise TrainingDiverged(f"training diverged: the {name.replace('_', ' ')} is {bad[0]} by step {step} "
                                       f"(train.lr={self.train_cfg.lr:g}); lower train.lr (or raise "
                                       f"train.warmup_steps)")
