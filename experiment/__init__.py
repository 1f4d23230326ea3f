"""The library behind the entry points, by verb (docs/architecture.md: Layout):

    config.py   the typed config (sections, defaults written once, legacy runs, differences)
    store/      the run folder at the ground: run.py (RunDir, opened), files, lock, records,
                tensorboard, checkpoints (orbax: the one module of store/ that needs JAX)
    model.py    the model a config describes;  cli.py what the entry points share
    train/      the training loop, step, optimizer, metrics, init_from
    evals/      scoring a checkpoint: one registry entry and module per evaluation kind (kinds.py)
    report/     plots and tables of the records, one module per kind
    pipeline/   run.py (train_and_evaluate, sweep), table.py (the table of every scheme)
    runtime/    devices and processes: sharding, distributed, accelerator, host_memory, start
    selfcheck/  the first command on a new machine;  convert/ runs from and to other formats

Nothing is imported here: `import experiment.config` or a report loads only what it needs (no JAX).
Import what you use from where it lives: `from experiment.train import train`, `from
experiment.evals import evaluate`, `from experiment.pipeline.run import sweep`.
"""
