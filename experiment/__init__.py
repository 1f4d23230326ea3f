"""The library behind the entry points.

    config.py      the typed config (sections, defaults written once, legacy runs, differences)
    run.py         one run directory: every path, its lock (lock.py), records, origin
    records.py     every kind of evaluation record: file, key, merging
    checkpoints.py orbax checkpoints; model.py the model a config describes
    train/         the training loop, step, optimizer, metrics, init_from
    evals/         scoring a checkpoint: perplexity, passkey, attention (+ common.py)
    report/        plots and tables of the records: perplexity, passkey, attention (+ plots.py)
    runtime/       devices and processes: sharding, distributed, accelerator, host_memory, start
    pipeline.py    train_and_evaluate, sweep;  cli.py what the entry points share

Importing the package (or `experiment.config`) loads nothing else: the names below are imported
from their modules on first use. `train` is also the name of a subpackage, which is what
`experiment.train` is where something imported the subpackage first: import the function as
`from experiment.train import train`.
"""
import importlib

_LAZY = {"ConfigError": "experiment.config", "PasskeySpec": "experiment.evals", "evaluate": "experiment.evals",
         "evaluate_attention": "experiment.evals", "evaluate_passkey": "experiment.evals",
         "sweep": "experiment.pipeline", "train_and_evaluate": "experiment.pipeline",
         "write_report": "experiment.report.write", "is_trained": "experiment.train", "train": "experiment.train"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
