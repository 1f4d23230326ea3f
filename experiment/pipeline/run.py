"""Whole experiments: one run trained then evaluated (`train_and_evaluate`), and a grid of runs
(schemes x training lengths x any config keys x seeds), each in its own workdir, then one report
(`sweep`). A seed other than the config's own is a suffix of the folder's name (`seed_name`:
alibi_L64_seed1), so that the config's own seed keeps the name a sweep without seeds gives it.

Runs of a sweep that are already complete (trained to config.train.steps and evaluated at every
length) restore nothing; interrupted ones resume from their last checkpoint, and a trained run is
evaluated at the lengths it lacks (evaluate_kinds' `skip_done`: what "evaluated" means, once). Every set of runs (a sweep,
the table of every scheme: experiment/pipeline/table.py) goes through the same two steps: every
config resolved before any run starts (`resolve_runs`), then the runs in turn (`run_each`).
"""
from __future__ import annotations

import copy
import itertools
import logging
import pathlib
import traceback
from typing import Callable, Iterable

import ml_collections

import posenc
from experiment import config as config_lib
from experiment.config import Config
from experiment.evals.common import parse_overrides
from experiment.evals.kinds import Request, evaluate_kinds
from experiment.runtime import distributed, interrupts
from experiment.store import output
from experiment.store.run import opened
from experiment.train import is_trained, train

log = logging.getLogger(__name__)


def write_report(workdirs, out):
    """experiment.report's write_report, imported on first use: it loads matplotlib (~0.4 s), which a
    process that only trains or scores never needs."""
    from experiment.report import write_report as write
    return write(workdirs, out)


def train_and_evaluate(config, workdir: str | pathlib.Path, *, max_steps: int | None = None,
                       skip_done: bool = False) -> dict:
    """Train (or resume) the run in `workdir`; once training is complete, evaluate it as
    `config.eval` says (lengths the scheme cannot encode are skipped with a warning). The run
    directory is held from the first step to the last record; the config is checked before it is
    created. `skip_done` (a sweep going on): a run already trained is not trained again, and only
    the lengths whose records it lacks are evaluated, so a complete run restores nothing."""
    config = config_lib.resolve(config)
    with opened(workdir, "training") as run:
        trained = skip_done and is_trained(run, config)
        if trained:
            log.info("%s: trained to step %d already, not trained again; evaluating the lengths it lacks",
                     run.path.name, run.latest_step())
        summary = ({"workdir": str(run.path), "step": run.latest_step(), "done": True} if trained
                   else train(config, run, max_steps=max_steps))
        if summary["done"]:
            summary["eval"] = evaluate_kinds(run, ("perplexity",), evaluation(config, skip_done))["perplexity"]
    return summary


def evaluation(config: Config, skip_done: bool = False) -> Request:
    """What `config.eval` asks of a trained run: perplexity at its lengths with its overrides."""
    ev = config.eval
    return Request(tuple(ev.lengths), parse_overrides(ev.overrides), skip_impossible=True, skip_done=skip_done,
                   options={"stride": ev.stride, "split": ev.split, "max_tokens": ev.max_tokens})


def run_config(base: ml_collections.ConfigDict, scheme: str, train_length: int | None,
               settings: dict[str, str] | None = None) -> Config:
    """The config of one grid point: `base` with its scheme, training length and --grid settings.
    Values the config file ties to others (ml_collections FieldReferences: configs/extend.py's
    yarn_scale = train.seq_len / the base's length) follow them, as with --config flags. A --grid
    key of a scheme option must act on this run: otherwise the grid trains identical runs."""
    if isinstance(base, ml_collections.ConfigDict):
        config = copy.deepcopy(base)  # keeps its FieldReferences tied
    else:
        config = ml_collections.ConfigDict(config_lib.typed(base).to_dict())
    config.posenc.name = scheme
    if train_length:
        config.train.seq_len = int(train_length)
    for dotted, value in (settings or {}).items():
        if dotted == "posenc.name":
            raise ValueError("--grid posenc.name: the schemes of a sweep are --schemes (e.g. --schemes alibi,rope)")
        try:
            posenc.check_option_key(config.posenc, dotted)
        except ValueError as e:
            raise ValueError(f"--grid {dotted}: {e}; a grid of it would train identical {scheme} runs, so sweep "
                             f"it in a sweep of the schemes that use it (--schemes)") from None
        config_lib.set_typed(config, dotted, value, option="--grid")
    return config_lib.resolve(config)


def grid_points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of `--grid KEY=v1,v2` values, as {KEY: value} (one empty point without a grid)."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def run_name(scheme: str, config: Config, settings: dict[str, str]) -> str:
    """`<scheme>_L<L>`, then `_<last key part><value>` per grid key: rope_L256_steps100 (the seed is
    `seed_name`'s)."""
    return f"{scheme}_L{config.train.seq_len}" + "".join(f"_{k.split('.')[-1]}{v}" for k, v in settings.items()
                                                          if k != "seed")


def seed_name(name: str, seed: int, base_seed: int) -> str:
    """The folder of run `name` trained with `seed`: `name` for the config's own seed (`base_seed`),
    else `name_seed<seed>`."""
    return name if int(seed) == int(base_seed) else f"{name}_seed{int(seed)}"


def seed_settings(seeds: list[int] | None, base_seed: int) -> list[dict[str, str]]:
    """The settings of each of `--seeds` ({"seed": "1"}), the config's own (`base_seed`) first; one
    empty setting (the config's own seed) without them. A seed given twice is refused."""
    twice = sorted({s for s in seeds or [] if list(seeds).count(s) > 1})
    if twice:
        raise ValueError(f"--seeds {','.join(map(str, seeds))}: seed {twice[0]} is given twice; give each once "
                         f"(--seeds {','.join(map(str, sorted(set(seeds))))})")
    ordered = sorted(seeds or [], key=lambda s: int(s) != int(base_seed))  # stable: the rest as given
    return [{"seed": str(int(s))} for s in ordered] if seeds else [{}]


def resolve_runs(base: ml_collections.ConfigDict, root: pathlib.Path,
                 points: Iterable[tuple[str | None, str, int | None, dict[str, str]]]) -> dict[pathlib.Path, Config]:
    """{root/<name>: config} of every (name, scheme, training length, settings) point, each config
    resolved before any run starts: a typo fails before hours of training. A point without a name
    is named by `run_name`; a seed other than the base config's adds its suffix (`seed_name`)."""
    configs = {}
    base_seed = int(base.seed)
    for name, scheme, length, settings in points:
        config = run_config(base, scheme, length, settings)
        configs[root / seed_name(name or run_name(scheme, config, settings), config.seed, base_seed)] = config
    return configs


def run_each(root: pathlib.Path, configs: dict[pathlib.Path, Config], work: Callable[[pathlib.Path, Config], None],
             *, failed: dict[str, str] | None = None, after: Callable[[], None] | None = None) -> None:
    """`work(workdir, config)` for each run in turn, logged as [i/n]; `after()` after each. A Ctrl-C
    says how many runs are done and that the same command goes on from there. With `failed` (a
    dict), a run that raises is logged there ({name: error}) and the next one goes on."""
    for i, (workdir, config) in enumerate(configs.items(), 1):
        log.info("[%d/%d] %s", i, len(configs), workdir)
        try:
            work(workdir, config)
        except interrupts.Interrupted as e:
            raise interrupts.Interrupted(
                f"sweep {root}: {i - 1} of {len(configs)} runs done; in {workdir.name}: {e.saved}; the same sweep "
                f"command skips the runs that are complete and goes on from there") from None
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - with `failed`, one run's failure must not stop the others
            if failed is None:
                raise
            failed[workdir.name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            log.error("%s failed; going on with the next run:\n%s", workdir.name, traceback.format_exc())
        if after is not None:
            after()


def sweep(base: ml_collections.ConfigDict, schemes: list[str], train_lengths: list[int],
          root: str | pathlib.Path, grid: dict[str, list[str]] | None = None, seeds: list[int] | None = None) -> dict:
    """Train and evaluate every (scheme, L, grid point, seed) in `root/<run_name>[_seed<N>]`; report in
    `root/report` (runs that differ only in their seed drawn as one curve with its spread:
    experiment/report/seeds.py). `grid` ({"train.steps": ["25", "100"]}) adds any config keys to the
    product; `seeds` ([0, 1, 2]) trains each point once per seed (default: the config's seed), the
    config's own seed first for every point, then the next seed for every point, and so on."""
    root = pathlib.Path(root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--workdir {root} is a file; give a folder (one sub-folder per run is created)")
    bad = [length for length in train_lengths if length < 1]
    if bad:
        raise ValueError(f"--train_lengths must be positive, got {bad[0]}")
    empty = [key for key, values in (grid or {}).items() if not values]
    if empty:
        raise ValueError(f"--grid {empty[0]}= gives no values; give them as --grid {empty[0]}=v1,v2")
    if "seed" in (grid or {}):
        raise ValueError(f"--grid seed={','.join(grid['seed'])}: the seeds of a sweep are --seeds (e.g. --seeds "
                         f"{','.join(grid['seed'])}): one folder per seed, the config's own seed keeping its name")
    configs = resolve_runs(base, root, ((None, scheme, length, {**settings, **seed})
                                        for seed in seed_settings(seeds, int(base.seed))
                                        for scheme in schemes for length in train_lengths or [None]
                                        for settings in grid_points(grid or {})))
    output.claim(root / "report", "report.py", "the sweep's report",  # before hours of training
                 instead="move it away (the sweep writes its report there), or use another --workdir")

    def work(workdir: pathlib.Path, config: Config) -> None:
        train_and_evaluate(config, workdir, skip_done=True)
    run_each(root, configs, work)
    distributed.barrier("lengthx_sweep")  # every run's results written before the report reads them
    return write_report(list(configs), root / "report") if distributed.is_writer() else {}
