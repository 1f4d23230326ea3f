"""The library behind the entry points: train, evaluate, report, sweep."""
from __future__ import annotations

import contextlib

from experiment import distributed
from experiment.evaluation import evaluate
from experiment.reporting import write_report
from experiment.run import RunDir
from experiment.training import ConfigError, is_trained, train


def train_and_evaluate(config, workdir, *, max_steps: int | None = None) -> dict:
    """Train (or resume) the run in `workdir`; once training is complete, evaluate it as
    `config.eval` says (lengths the scheme cannot encode are skipped with a warning). The run
    directory stays locked from the first step to the last record."""
    with RunDir(workdir).locked("training") if distributed.is_writer() else contextlib.nullcontext():
        summary = train(config, workdir, max_steps=max_steps)
        if summary["done"]:
            summary["eval"] = evaluate(workdir, skip_impossible=True)
    return summary


__all__ = ["ConfigError", "evaluate", "is_trained", "train", "train_and_evaluate", "write_report"]
