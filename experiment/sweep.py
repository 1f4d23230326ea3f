"""A grid of runs (schemes x training lengths), each in its own workdir, then one report.

Runs that are already complete (trained to config.train.steps and evaluated at every length) are
skipped; interrupted ones resume from their last checkpoint.
"""
from __future__ import annotations

import logging
import pathlib

import ml_collections

from experiment import config_util, distributed, evaluation, records, train_and_evaluate
from experiment.reporting import write_report
from experiment.run import RunDir
from experiment.training import is_trained

log = logging.getLogger(__name__)


def run_config(base: ml_collections.ConfigDict, scheme: str, train_length: int | None):
    config = ml_collections.ConfigDict(base.to_dict())
    config.posenc.name = scheme
    if train_length:
        config.train.seq_len = int(train_length)
    return config_util.resolve(config)


def is_evaluated(workdir: pathlib.Path, config) -> bool:
    """Every record config.eval asks for is there, from the newest checkpoint."""
    run = RunDir(workdir)
    if not run.exists() or run.latest_step() is None:
        return False
    spec = evaluation.eval_spec(config)
    latest = run.latest_step()
    done = {records.record_key(r) for r in run.results() if r.get("step") == latest}
    wanted = [{"split": spec["split"], "eval_length": l, "stride": spec["stride"] or l,
               "max_tokens": spec["max_tokens"], "overrides": spec["overrides"]} for l in spec["lengths"]]
    return all(records.record_key(w) in done for w in wanted)


def sweep(base: ml_collections.ConfigDict, schemes: list[str], train_lengths: list[int],
          root: str | pathlib.Path) -> dict:
    """Train and evaluate every (scheme, L) in `root/<scheme>_L<L>`; report in `root/report`."""
    root = pathlib.Path(root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--workdir {root} is a file; give a folder (one sub-folder per run is created)")
    bad = [l for l in train_lengths if l < 1]
    if bad:
        raise ValueError(f"--train_lengths must be positive, got {bad[0]}")
    configs = {}
    for scheme in schemes:  # resolve every config first: a typo fails before hours of training
        for length in train_lengths or [None]:
            config = run_config(base, scheme, length)
            configs[root / f"{scheme}_L{config.train.seq_len}"] = config
    for i, (workdir, config) in enumerate(configs.items(), 1):
        log.info("[%d/%d] %s", i, len(configs), workdir)
        if is_trained(workdir, config) and is_evaluated(workdir, config):
            log.info("complete, skipping")
            continue
        train_and_evaluate(config, workdir)
    distributed.barrier("lengthx_sweep")  # every run's results written before the report reads them
    return write_report(list(configs), root / "report") if distributed.is_writer() else {}
