"""The run folder, at the ground of experiment/: its paths, config, tokenizer, streams, metrics,
records and origin (run.py: RunDir, opened), its files written whole and read back checked
(files.py), its lock (lock.py), every kind of evaluation record (records.py), TensorBoard event
files (tensorboard.py) and orbax checkpoints (checkpoints.py, the one module here that needs JAX).
Nothing is imported here, so importing one of them loads no other."""
