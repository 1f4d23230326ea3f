"""The library behind the entry points: train, evaluate, report, sweep."""
from __future__ import annotations

from experiment.evaluation import evaluate
from experiment.reporting import write_report
from experiment.training import ConfigError, is_trained, train


def train_and_evaluate(config, workdir, *, max_steps: int | None = None) -> dict:
    """Train (or resume) the run in `workdir`; once training is complete, evaluate it at
    `config.eval.lengths` (lengths the scheme cannot encode are skipped with a warning)."""
    summary = train(config, workdir, max_steps=max_steps)
    if summary["done"]:
        summary["eval"] = evaluate(workdir, skip_impossible=True)
    return summary


__all__ = ["ConfigError", "evaluate", "is_trained", "train", "train_and_evaluate", "write_report"]
