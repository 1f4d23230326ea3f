"""Whole experiments: one run trained then evaluated and a grid of runs (run.py: train_and_evaluate,
sweep, and the loop every set of runs goes through), and the table of every scheme built on that
loop (table.py; its rows are a config: configs/all_schemes.py)."""
