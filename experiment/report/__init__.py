"""Reports from run directories' records: one module per evaluation kind (perplexity, passkey,
attention), what their figures share (plots.py: styles, saving; ticks.py: tick labels), what the
runs are and how they are named (runs.py), the paper's published numbers (paper.py), and the whole
report of a set of runs (write.py: `write_report`). Reports read JSON, checked on reading
(experiment/store/records.py); nothing here scores.

Every report starts from the perplexity records (the runs, their curves); each other record kind
(experiment/store/records.py: KINDS) adds its part with `report(runs, out)` of its module here.
`write_report` and `PAPER_MODES` are imported from their modules on first use, so that a config
reading paper.py loads no other module of the package.
"""
from posenc.lazy import lazy_attributes

_LAZY = {"write_report": "experiment.report.write", "PAPER_MODES": "experiment.report.perplexity"}

__all__ = ["PAPER_MODES", "write_report"]

__getattr__ = lazy_attributes(__name__, _LAZY)
