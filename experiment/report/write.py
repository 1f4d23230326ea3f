"""The whole report of a set of runs (`write_report`, what report.py and the pipeline call): the
perplexity report, then each other record kind's part (experiment/store/records.py: KINDS) from
`report(runs, out)` of its module in experiment/report/, for the runs that have its records. Runs
that differ only in their seed are one run of the report (experiment/report/seeds.py: its
`members` the seeds). Its files replace those of the earlier report there, and no other file is
touched (experiment/store/output.py: written aside, moved in at the end)."""
from __future__ import annotations

import importlib
import pathlib

from experiment.report import perplexity, seeds
from experiment.report.perplexity import PAPER_MODES
from experiment.store import output, records


def write_report(workdirs: list[str | pathlib.Path], out: str | pathlib.Path, paper_mode: str = "auto") -> dict:
    """Write OUT/ppl_vs_length.png, OUT/loss_by_position.png and OUT/ppl_vs_length.md, and each
    other kind's files (attention_<run>.png, the passkey report, ...) for the runs that have those
    records; OUT is new, empty or an earlier report, whose files this report's replace (any other file
    there stays)."""
    if paper_mode not in PAPER_MODES:
        raise ValueError(f"unknown paper mode {paper_mode!r}; valid: {', '.join(PAPER_MODES)}")
    out = pathlib.Path(out)
    output.claim(out, "report.py")  # before reading any run
    runs = seeds.grouped(perplexity.load_runs(workdirs))
    with output.replacing(out, "report.py") as staging:
        paths = perplexity.write(runs, staging, paper_mode)
        for kind in records.KINDS:
            if kind != "perplexity":
                paths.update(importlib.import_module(f"experiment.report.{kind}").report(runs, staging))
    return output.moved(paths, staging, out)
