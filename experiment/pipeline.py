"""Whole experiments: one run trained then evaluated (`train_and_evaluate`), and a grid of runs
(schemes x training lengths x any config keys), each in its own workdir, then one report (`sweep`).

Runs of a sweep that are already complete (trained to config.train.steps and evaluated at every
length) are skipped; interrupted ones resume from their last checkpoint.
"""
from __future__ import annotations

import itertools
import logging
import pathlib

import ml_collections

from experiment import config as config_lib, records
from experiment.config import Config
from experiment.evals.common import eval_spec
from experiment.evals.perplexity import evaluate
from experiment.report import write_report
from experiment.run import RunDir, opened
from experiment.runtime import distributed
from experiment.train import is_trained, train

log = logging.getLogger(__name__)


def train_and_evaluate(config, workdir: str | pathlib.Path, *, max_steps: int | None = None) -> dict:
    """Train (or resume) the run in `workdir`; once training is complete, evaluate it as
    `config.eval` says (lengths the scheme cannot encode are skipped with a warning). The run
    directory is held from the first step to the last record."""
    with opened(workdir, "training") as run:
        summary = train(config, run, max_steps=max_steps)
        if summary["done"]:
            summary["eval"] = evaluate(run, skip_impossible=True)
    return summary


def run_config(base: ml_collections.ConfigDict, scheme: str, train_length: int | None,
               settings: dict[str, str] | None = None) -> Config:
    """The config of one grid point: `base` with its scheme, training length and --grid settings."""
    config = ml_collections.ConfigDict(config_lib.typed(base).to_dict())
    config.posenc.name = scheme
    if train_length:
        config.train.seq_len = int(train_length)
    for dotted, value in (settings or {}).items():
        config_lib.set_typed(config, dotted, value, option="--grid")
    return config_lib.resolve(config)


def grid_points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of `--grid KEY=v1,v2` values, as {KEY: value} (one empty point without a grid)."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def run_name(scheme: str, config: Config, settings: dict[str, str]) -> str:
    """`<scheme>_L<L>`, then `_<last key part><value>` per grid key: rope_L256_steps100."""
    return f"{scheme}_L{config.train.seq_len}" + "".join(f"_{k.split('.')[-1]}{v}" for k, v in settings.items())


def is_evaluated(workdir: pathlib.Path, config: Config) -> bool:
    """Every record config.eval asks for is there, from the newest checkpoint."""
    run = RunDir(workdir)
    if not run.exists() or run.latest_step() is None:
        return False
    spec = eval_spec(config)
    latest = run.latest_step()
    done = {records.record_key(r) for r in run.records("perplexity") if r.get("step") == latest}
    wanted = [{"split": spec.split, "eval_length": length, "stride": spec.stride or length,
               "max_tokens": spec.max_tokens, "overrides": spec.overrides} for length in spec.lengths]
    return all(records.record_key(w) in done for w in wanted)


def sweep(base: ml_collections.ConfigDict, schemes: list[str], train_lengths: list[int],
          root: str | pathlib.Path, grid: dict[str, list[str]] | None = None) -> dict:
    """Train and evaluate every (scheme, L, grid point) in `root/<run_name>`; report in `root/report`.
    `grid` ({"train.steps": ["25", "100"]}) adds any config keys to the product."""
    root = pathlib.Path(root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--workdir {root} is a file; give a folder (one sub-folder per run is created)")
    bad = [length for length in train_lengths if length < 1]
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
