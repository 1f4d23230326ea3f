"""A grid of runs (schemes x training lengths), each in its own workdir, then one report.

Runs that are already complete (trained to config.train.steps and evaluated at every length) are
skipped; interrupted ones resume from their last checkpoint.
"""
from __future__ import annotations

import json
import logging
import pathlib

import ml_collections

from experiment import config_util, distributed
from experiment.evaluation import evaluate
from experiment.reporting import write_report
from experiment.training import is_trained, train

log = logging.getLogger(__name__)


def run_config(base: ml_collections.ConfigDict, scheme: str, train_length: int | None):
    config = ml_collections.ConfigDict(base.to_dict())
    config.posenc.name = scheme
    if train_length:
        config.train.seq_len = int(train_length)
    return config_util.resolve(config)


def is_evaluated(workdir: pathlib.Path, config) -> bool:
    path = workdir / "eval" / "extrapolation.json"
    if not path.exists():
        return False
    done = {(r["eval_length"], r["stride"]) for r in json.loads(path.read_text())
            if r.get("split") == config.eval.split and r.get("max_tokens", 0) == config.eval.get("max_tokens", 0)}
    stride = lambda l: config.eval.stride or l
    return all((l, stride(l)) in done for l in config.eval.lengths)


def sweep(base: ml_collections.ConfigDict, schemes: list[str], train_lengths: list[int],
          root: str | pathlib.Path) -> dict:
    """Train and evaluate every (scheme, L) in `root/<scheme>_L<L>`; report in `root/report`."""
    root = pathlib.Path(root)
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
        train(config, workdir)
        evaluate(workdir, config.eval.lengths, config.eval.stride, config.eval.split, skip_impossible=True)
    distributed.barrier("lengthx_sweep")  # every run's results written before the report reads them
    return write_report(list(configs), root / "report") if distributed.is_writer() else {}
