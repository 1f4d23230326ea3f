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
"""
from experiment.config import ConfigError
from experiment.evals import PasskeySpec, evaluate, evaluate_attention, evaluate_passkey
from experiment.pipeline import sweep, train_and_evaluate
from experiment.report import write_report
from experiment.train import is_trained, train

__all__ = ["ConfigError", "PasskeySpec", "evaluate", "evaluate_attention", "evaluate_passkey", "is_trained",
           "sweep", "train", "train_and_evaluate", "write_report"]
