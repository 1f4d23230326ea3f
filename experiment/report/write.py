"""The whole report of a set of runs: each evaluation kind's figures and tables, for the runs that
have its records (`write_report`, what report.py and the pipeline call)."""
from __future__ import annotations

import pathlib

from experiment.report import attention, passkey, perplexity
from experiment.report.perplexity import PAPER_MODES


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
    paths["attention_pngs"] = attention.write(runs, out)
    with_passkey = [run for run in runs if run["run"].records_path("passkey").exists()]
    if with_passkey:
        paths["passkey"] = passkey.write(with_passkey, out)
    return paths

