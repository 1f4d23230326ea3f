"""A grid of runs (schemes x training lengths), each in its own workdir, then one report.

Runs that are already complete (trained to config.train.steps and evaluated at every length) are
skipped; interrupted ones resume from their last checkpoint.
"""
from __future__ import annotations

import itertools
import logging
import pathlib

import ml_collections

from experiment import config_util, distributed, evaluation, records, train_and_evaluate
from experiment.reporting import write_report
from experiment.run import RunDir
from experiment.training import is_trained

log = logging.getLogger(__name__)


def run_config(base: ml_collections.ConfigDict, scheme: str, train_length: int | None,
               settings: dict[str, str] | None = None):
    config = ml_collections.ConfigDict(base.to_dict())
    config.posenc.name = scheme
    if train_length:
        config.train.seq_len = int(train_length)
    for dotted, value in (settings or {}).items():
        config_util.set_typed(config, dotted, value, option="--grid")
    return config_util.resolve(config)


def grid_points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of `--grid KEY=v1,v2` values, as {KEY: value} (one empty point without a grid)."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def run_name(scheme: str, config, settings: dict[str, str]) -> str:
    """`<scheme>_L<L>`, then `_<last key part><value>` per grid key: rope_L256_steps100."""
    return f"{scheme}_L{config.train.seq_len}" + "".join(f"_{k.split('.')[-1]}{v}" for k, v in settings.items())


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
          root: str | pathlib.Path, grid: dict[str, list[str]] | None = None) -> dict:
    """Train and evaluate every (scheme, L, grid point) in `root/<run_name>`; report in `root/report`.
    `grid` ({"train.steps": ["25", "100"]}) adds any config keys to the product."""
    root = pathlib.Path(root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--workdir {root} is a file; give a folder (one sub-folder per run is created)")
    bad = [l for l in train_lengths if l < 1]
    if bad:
        raise ValueError(f"--train_lengths must be positive, got {bad[0]}")
    configs = {}
    for scheme in schemes:  # resolve every config first: a typo fails before hours of training
        for length in train_lengths or [None]:
            for settings in grid_points(grid or {}):
                config = run_config(base, scheme, length, settings)
                configs[root / run_name(scheme, config, settings)] = config
    for i, (workdir, config) in enumerate(configs.items(), 1):
        log.info("[%d/%d] %s", i, len(configs), workdir)
        if is_trained(workdir, config) and is_evaluated(workdir, config):
            log.info("complete, skipping")
            continue
        train_and_evaluate(config, workdir)
    distributed.barrier("lengthx_sweep")  # every run's results written before the report reads them
    return write_report(list(configs), root / "report") if distributed.is_writer() else {}
