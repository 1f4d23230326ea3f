"""Reports from run directories' records: one module per evaluation kind (perplexity, passkey,
attention), what their figures share (plots.py: styles, saving; ticks.py: tick labels), what the
runs are and how they are named (runs.py), and the paper's published numbers (paper.py). Reports
read JSON, checked on reading (experiment/store/records.py); nothing here scores.

Every report starts from the perplexity records (the runs, their curves); each other record kind
(experiment/store/records.py: KINDS) adds its part with `report(runs, out)` of its module here.
"""
from __future__ import annotations

import importlib
import pathlib

from experiment.report import perplexity
from experiment.report.perplexity import PAPER_MODES
from experiment.store import records


def write_report(workdirs: list[str | pathlib.Path], out: str | pathlib.Path, paper_mode: str = "auto") -> dict:
    """Write OUT/ppl_vs_length.png, OUT/loss_by_position.png and OUT/ppl_vs_length.md, and
    OUT/attention_<run>.png and the passkey report (experiment/report/passkey.py) for the runs
    that have those records."""
    if paper_mode not in PAPER_MODES:
        raise ValueError(f"unknown paper mode {paper_mode!r}; valid: {', '.join(PAPER_MODES)}")
    out = pathlib.Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder")
    runs = perplexity.load_runs(workdirs)
    out.mkdir(parents=True, exist_ok=True)
    paths = perplexity.write(runs, out, paper_mode)
    for kind in records.KINDS:
        if kind != "perplexity":
            paths.update(importlib.import_module(f"experiment.report.{kind}").report(runs, out))
    return paths


__all__ = ["PAPER_MODES", "write_report"]
