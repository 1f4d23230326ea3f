"""The table of every scheme (issue #23; results/all_schemes/): the rows of a study, each trained alike
(one config) and evaluated alike (perplexity and passkey retrieval at each of config.eval.lengths),
then one table, one heat map and their numbers (experiment/report/schemes.py).

    python sweep.py --config configs/all_schemes.py --table --workdir runs/all_schemes

The study is a config's `get_table()` (configs/all_schemes.py; sweep.py --table reads it from the
--config file): {"every_scheme": true or false, "rows": [...], "notes": {scheme: text}}. With
every_scheme, every registered scheme with its defaults comes first (a scheme joins the table by
registering; `notes` says in words what such a row is, where its form departs from its paper); each further row
names its training run (a folder under the root, trained with `scheme` and the config `settings`)
and, for an option switched on at evaluation, its `overrides`: a rule of RULES with its arguments,
which sets the option at each evaluation length (PI's factor L / L_valid, Self-Extend's group, ...).

The runs go through the pipeline's own loop (experiment/pipeline/run.py: every config resolved
first, then each run in turn); every row of a run is evaluated in one call of evaluate_kinds, which
restores its checkpoint once. It resumes at every step: a run trained to config.train.steps is not
trained again, an interrupted one resumes from its checkpoint, and an evaluation whose records are
there (same length, overrides, settings and checkpoint: evaluate_kinds' `skip_done`) is not redone. A length a scheme cannot encode (a
learned table) is not evaluated and its cells say why; a run that fails is logged, its cells say so,
and the others go on. The manifest (ROOT/rows.json), the times (ROOT/timings.json) and the report
are rewritten after every run.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time

import ml_collections

import posenc
from experiment.config import Config
from experiment.evals.common import apply_overrides, eval_spec
from experiment.evals.kinds import Request, evaluate_kinds
from experiment.evals.passkey import PasskeySpec, spec_options
from experiment.model import abstract_model
from experiment.pipeline.run import resolve_runs, run_each, seed_settings
from experiment.report import schemes as report
from experiment.store import output
from experiment.store.files import write_atomically
from experiment.store.run import RunDir, RunError, opened
from experiment.train import is_trained, train

log = logging.getLogger(__name__)


def _ratio(length: int, train_length: int, *keys: str) -> dict[str, str]:
    """Each of `keys` = L_valid / L."""
    return {key: f"{length / train_length:g}" for key in keys}


def _inverse_ratio(length: int, train_length: int, *keys: str) -> dict[str, str]:
    """Each of `keys` = L / L_valid."""
    return {key: f"{1 / (length / train_length):g}" for key in keys}


def _fixed(length: int, train_length: int, values: dict) -> dict[str, str]:
    """The same values at every length."""
    return {key: str(value) for key, value in values.items()}


def _fraction_of_length(length: int, train_length: int, fractions: dict) -> dict[str, str]:
    """{key: (a, b)}: key = a L / b (rounded down) at every length."""
    return {key: str(a * train_length // b) for key, (a, b) in fractions.items()}


def _self_extend(length: int, train_length: int) -> dict[str, str]:
    """W = L/2; G the smallest group size that keeps the largest relative position W + (n - W) / G
    within L at length n."""
    window = train_length // 2
    group = max(1, math.ceil((length - window) / (train_length - window)))
    return {"posenc.rope.self_extend_window": str(window), "posenc.rope.self_extend_group": str(group)}


# The rules a study's row may name for its overrides: (evaluation length, training length, *arguments) -> {key: value}
RULES = {"ratio": _ratio, "inverse_ratio": _inverse_ratio, "fixed": _fixed, "fraction_of_length": _fraction_of_length,
         "self_extend": _self_extend}


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: `name` as shown, the training run it reads (`run`, a folder under the
    root, trained with `scheme` and the config `settings`), the eval-time overrides it takes at each
    length ((a rule of RULES, its arguments...)), `rule` (those settings in words) and `cite` (the
    option's citation, beside the scheme's)."""
    name: str
    run: str
    scheme: str
    settings: tuple = ()               # ((dotted config key, value), ...) of the training run
    overrides: tuple = ()              # ("ratio", "posenc.rope.yarn_scale"): RULES["ratio"](n, L, key)
    rule: str = ""
    cite: str = ""                     # 'YaRN: Peng et al. 2023'

    def overrides_at(self, length: int, train_length: int) -> dict[str, str]:
        return dict(RULES[self.overrides[0]](length, train_length, *self.overrides[1:])) if self.overrides else {}


ROW_KEYS = ("name", "run", "scheme", "settings", "overrides", "rule", "cite")


def rows(study: dict, where: str = "the study") -> list[Row]:
    """The rows of a study (a config's get_table(), configs/all_schemes.py), checked: every key known,
    each row named once, each overrides rule one of RULES. `where` names the study in errors."""
    if not isinstance(study, dict) or set(study) - {"every_scheme", "rows", "notes"}:
        raise ValueError(f"{where} must be a dict of every_scheme (true or false), rows (a list of dicts) and notes "
                         f"(scheme: what its every_scheme row is, in words)")
    notes = dict(study.get("notes") or {})
    unknown = sorted(set(notes) - set(posenc.names())) if study.get("every_scheme") else sorted(notes)
    if unknown:
        raise ValueError(f"{where}: notes of {', '.join(unknown)}: no such every_scheme row (notes describe the rows "
                         f"every_scheme adds, one per registered scheme: {', '.join(posenc.names())})")
    out = [Row(name, name, name, rule=notes.get(name, "")) for name in posenc.names()] \
        if study.get("every_scheme") else []
    for i, given in enumerate(study.get("rows") or []):
        if not isinstance(given, dict) or set(given) - set(ROW_KEYS) or not {"name", "run", "scheme"} <= set(given):
            raise ValueError(f"{where}: row {i} ({given!r:.60}) is not a dict of {', '.join(ROW_KEYS)} with name, "
                             f"run and scheme given")
        overrides = tuple(given.get("overrides") or ())
        if overrides and overrides[0] not in RULES:
            raise ValueError(f"{where}: row {given['name']!r}: overrides rule {overrides[0]!r} is not one of "
                             f"{', '.join(RULES)} (experiment/pipeline/table.py: RULES)")
        out.append(Row(given["name"], given["run"], given["scheme"], tuple(dict(given.get("settings") or {}).items()),
                       overrides, given.get("rule", ""), given.get("cite", "")))
    names = [row.name for row in out]
    twice = sorted({name for name in names if names.count(name) > 1})
    if not out or twice:
        raise ValueError(f"{where}: " + (f"rows named twice: {', '.join(twice)}" if twice else
                                         "no rows (set every_scheme or give rows)"))
    return out


def describe_row(row: Row, config: Config) -> dict:
    """The manifest entry of a row: name, run, family and citation from the registry (a wrapper's
    base named beside it), its rule and its overrides at each length."""
    cls = posenc.get(row.scheme)
    base = config.posenc.get(row.scheme, {}).get("base") if cls.family == "wrapper" else None
    citations = [cls.citation] + ([f"base: {posenc.get(base).citation}"] if base else []) + ([row.cite] if row.cite else [])
    return {"name": f"{row.name} [{base}]" if base and "[" not in row.name else row.name, "run": row.run,
            "scheme": row.scheme, "family": (f"wrapper of {posenc.get(base).family}" if base else cls.family) or "-",
            "citation": "; ".join(citations), "rule": row.rule,
            "overrides": {str(n): row.overrides_at(n, config.train.seq_len) for n in config.eval.lengths}}


# --- what a row cannot have -----------------------------------------------------------------

def impossible(run: RunDir, config: Config, overrides: dict, lengths) -> dict[int, str]:
    """{length: the scheme's LengthError} for the lengths the model (with `overrides`) cannot encode."""
    model = abstract_model(apply_overrides(config, overrides), run.tokenizer(config.data, write=False).vocab_size)
    out = {}
    for n in lengths:
        try:
            model.scheme.check_length(n)
        except posenc.LengthError as e:
            out[n] = str(e)
    return out


# --- running ------------------------------------------------------------------------------------

def _readable(read, root: pathlib.Path) -> dict:
    """What `read(root)` gives; a damaged file (RunError) is written again here, so it is read as empty."""
    try:
        return read(root)
    except RunError as e:
        log.warning("%s; writing it again", str(e).split(";")[0])
        return {"rows": []} if read is report.read_manifest else {}


class _Clock:
    """Wall and process CPU seconds of a phase, added to ROOT/timings.json under the run's name."""

    def __init__(self, root: pathlib.Path, run: str, phase: str):
        self.path, self.run, self.phase = root / report.TIMINGS, run, phase

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        times = _readable(report.read_timings, self.path.parent)
        entry = times.setdefault(self.run, {})
        for key, value in ((f"{self.phase}_wall_s", time.perf_counter() - self.wall),
                           (f"{self.phase}_cpu_s", time.process_time() - self.cpu)):
            entry[key] = entry.get(key, 0.0) + value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps(times, indent=1, sort_keys=True))
        return False


def _key(overrides: dict) -> str:
    return json.dumps(overrides, sort_keys=True)


def evaluate_run(table: list[Row], run: RunDir, config: Config, spec: PasskeySpec) -> dict[str, dict[str, str]]:
    """Perplexity and passkey retrieval of the rows of `table` (those of one run) at each length they
    lack, in one call of evaluate_kinds: the checkpoint restored once, or not at all where nothing
    is lacking (what is lacking is evaluate_kinds' `skip_done`). Rows sharing overrides at a length
    share its evaluation. Returns {row: {length: why}} for the lengths a row cannot have."""
    train_length, lengths = config.train.seq_len, [int(n) for n in config.eval.lengths]
    groups: dict[str, tuple[dict, set[int]]] = {}
    for row in table:
        for n in lengths:
            overrides = row.overrides_at(n, train_length)
            groups.setdefault(_key(overrides), (overrides, set()))[1].add(n)
    why = {key: impossible(run, config, overrides, sorted(ns)) for key, (overrides, ns) in groups.items()}
    todo = tuple((overrides, tuple(sorted(ns - set(why[key])))) for key, (overrides, ns) in groups.items()
                 if ns - set(why[key]))
    if todo:
        new = evaluate_kinds(run, ("perplexity", "passkey"), Request(groups=todo, skip_done=True, skip_impossible=True,
                                                                       options=spec_options(spec)))
        log.info("%s (rows %s): %d perplexity and %d passkey records new", run.path.name,
                 ", ".join(row.name for row in table), len(new["perplexity"]), len(new["passkey"]))
    return {row.name: {str(n): why[_key(row.overrides_at(n, train_length))][n] for n in lengths
                       if n in why[_key(row.overrides_at(n, train_length))]} for row in table}


def build(base: ml_collections.ConfigDict, table: list[Row], root: str | pathlib.Path,
          out: str | pathlib.Path | None = None, only: list[str] | None = None, spec: PasskeySpec = PasskeySpec(),
          seeds: list[int] | None = None, keep: str | pathlib.Path | None = None) -> dict:
    """Train and evaluate the run of every row of `table` (a study's `rows`) under `root` (only the
    runs named in `only`, if given; once per seed of `seeds`, a seed other than the config's own in
    RUN_seed<N>, which the report finds beside RUN), then write the report to `out` (default
    ROOT/report); with `keep` (an earlier table's all_schemes.json), rows whose runs are not under
    ROOT keep its numbers. Returns the report's paths and the runs that failed ({run folder: error})."""
    root = pathlib.Path(root)
    out = pathlib.Path(out) if out else root / "report"
    output.claim(out, "report.py")  # before any training
    firsts: dict[str, Row] = {}
    for row in table:  # each run trained with its first row's scheme and settings
        firsts.setdefault(row.run, row)
    configs = resolve_runs(base, root, ((run, row.scheme, None, dict(row.settings)) for run, row in firsts.items()))
    by_name = {workdir.name: config for workdir, config in configs.items()}
    unknown = sorted(set(only or []) - set(by_name))
    if unknown:
        raise ValueError(f"--schemes {', '.join(unknown)}: no such run in the table; valid: {', '.join(by_name)}")
    manifest = {"protocol": protocol(next(iter(configs.values())), spec),
                "rows": [describe_row(row, by_name[row.run]) for row in table]}
    run_of = {workdir: workdir.name for workdir in configs}  # each folder -> the run its rows name
    if seeds:
        configs, run_of = {}, {}
        for seed in seed_settings(seeds, int(base.seed)):
            resolved = resolve_runs(base, root, ((run, row.scheme, None, {**dict(row.settings), **seed})
                                                 for run, row in firsts.items()))
            for (workdir, config), run in zip(resolved.items(), firsts):
                configs[workdir], run_of[workdir] = config, run
    cannot_by_row: dict[str, dict] = {}
    failed: dict[str, str] = {}
    paths: dict = {}

    def work(workdir: pathlib.Path, config: Config) -> None:
        latest = RunDir(workdir).latest_step()
        if latest is not None and latest > config.train.steps:
            raise ValueError(f"{workdir} is trained to step {latest}, beyond train.steps = {config.train.steps}: "
                             f"every row is trained alike; give another --workdir or move that run away")
        if not is_trained(workdir, config):
            with _Clock(root, workdir.name, "train"), opened(workdir, "training") as opened_run:
                train(config, opened_run)
        with _Clock(root, workdir.name, "eval"):
            cannot_by_row.update(evaluate_run([r for r in table if r.run == run_of[workdir]], RunDir(workdir),
                                              config, spec))

    def write() -> None:
        paths.update(_write(root, out, manifest, table, cannot_by_row, failed, keep))

    selected = {workdir: config for workdir, config in configs.items() if not only or run_of[workdir] in only}
    run_each(root, selected, work, failed=failed, after=write)
    if not selected:
        write()
    return {**paths, "failed": failed}


def _write(root: pathlib.Path, out: pathlib.Path, manifest: dict, table: list[Row], cannot_by_row: dict,
           failed: dict, keep: str | pathlib.Path | None = None) -> dict:
    """The manifest with each row's impossible lengths (or its run's failure), then the report."""
    previous = _readable(report.read_manifest, root) if (root / report.MANIFEST).exists() else {"rows": []}
    kept = {r["name"]: r.get("cannot", {}) for r in previous["rows"]}  # rows not run this time keep theirs
    for row, entry in zip(table, manifest["rows"]):
        if row.run in failed:
            entry["cannot"] = {n: f"{row.run} failed: {failed[row.run]}" for n in entry["overrides"]}
        else:
            entry["cannot"] = cannot_by_row.get(row.name, kept.get(entry["name"], {}))
    root.mkdir(parents=True, exist_ok=True)
    write_atomically(root / report.MANIFEST, json.dumps(manifest, indent=1))
    return report.write(root, out, keep)


def protocol(config: Config, spec: PasskeySpec) -> dict:
    """What every row shares, as the report states it (from any row's config: they differ only in
    their scheme)."""
    data, tc, model = config.data, config.train, config.model
    digits = int(data.passkey_digits if spec.digits is None else spec.digits)
    ev = eval_spec(config)
    return {"train_length": tc.seq_len, "lengths": list(config.eval.lengths), "split": ev.split,
            "max_tokens": ev.max_tokens, "steps": tc.steps, "batch_size": tc.batch_size,
            "passkey": {"depths": list(spec.depths), "per_cell": spec.per_cell, "seed": spec.seed, "digits": digits},
            "description": (
                f"Every row: a {model.num_layers}-layer decoder (d = {model.d_model}, {model.num_heads} heads), "
                f"{data.tokenizer}-level, trained on {data.name} at L = {tc.seq_len} for {tc.steps} steps of "
                f"{tc.batch_size} x {tc.seq_len} tokens (lr {tc.lr:g}, seed {config.seed}), "
                f"{data.passkey_fraction:g} of the training rows passkey examples ({digits}-digit keys). "
                f"Perplexity: {data.tokenizer}-level, the {ev.split} split, nonoverlapping, every token once"
                + (f" (first {ev.max_tokens:,} tokens)" if ev.max_tokens else "") + ".")}
