"""The table of every scheme (issue #23; results/all_schemes/): every registered scheme and the notable
options, trained alike (one config: configs/passkey.py, the demo's model and data with the passkey mix)
and evaluated alike (perplexity and passkey retrieval at each of config.eval.lengths), then one table,
one heat map and their numbers (experiment/report/schemes.py).

    python sweep.py --config configs/passkey.py --table --workdir runs/all_schemes --out results/all_schemes

The rows (`rows`):
- every registered scheme with its defaults (a wrapper around its default base);
- `logn` and `randomized` around alibi too: their default base, rope, does not extrapolate and
  alibi does, so the pair says what each wrapper adds to either kind of base;
- rope with p_rope = 0.75 (Barbero et al.'s setting), a training-time choice;
- the rope run with each training-free extension switched on at evaluation (`--set`), its factor
  chosen per evaluation length (`EXTENSIONS`): PI, NTK-aware, dynamic NTK, YaRN, Llama 3, ReRoPE,
  Self-Extend, Dual Chunk Attention and LM-Infinite's Lambda mask. LongRoPE is left out: its factors are searched per
  model, not set by a rule.

It resumes at every step: a run trained to config.train.steps is not trained again, an interrupted
one resumes from its checkpoint, and an evaluation whose records are there (same length, overrides
and checkpoint) is not redone. A length a scheme cannot encode (a learned table) is not evaluated and
its cells say why; a run that fails is logged, its cells say so, and the others go on. The manifest
(ROOT/rows.json), the times (ROOT/timings.json) and the report are rewritten after every run.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time
import traceback
from typing import Callable

import ml_collections

import posenc
from experiment.store import records
from experiment.config import Config
from experiment.evals.common import apply_overrides, eval_spec
from experiment.evals.passkey import PasskeySpec, evaluate_passkey
from experiment.evals.perplexity import evaluate
from experiment.model import abstract_model
from experiment.pipeline.run import run_config
from experiment.report import schemes as report
from experiment.store.run import RunDir, opened
from experiment.train import is_trained, train

log = logging.getLogger(__name__)

Overrides = Callable[[int, int], dict]  # (evaluation length, training length) -> {key: value}


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: `name` as shown, the training run it reads (`run`, a folder under the
    root, trained with `scheme` and the config `settings`), the eval-time overrides it takes at each
    length, `rule` (those settings in words) and `cite` (the option's citation, beside the scheme's)."""
    name: str
    run: str
    scheme: str
    settings: tuple = ()               # ((dotted config key, value), ...) of the training run
    overrides: Overrides | None = None
    rule: str = ""
    cite: str = ""                     # 'YaRN: Peng et al. 2023'

    def overrides_at(self, length: int, train_length: int) -> dict[str, str]:
        return dict(self.overrides(length, train_length)) if self.overrides else {}


def _self_extend(length: int, train_length: int) -> dict[str, str]:
    """W = L/2; G the smallest group size that keeps the largest relative position W + (n - W) / G
    within L at length n."""
    window = train_length // 2
    group = max(1, math.ceil((length - window) / (train_length - window)))
    return {"posenc.rope.self_extend_window": str(window), "posenc.rope.self_extend_group": str(group)}


def _scale(key: str, invert: bool = False) -> Overrides:
    def overrides(length: int, train_length: int) -> dict[str, str]:
        factor = length / train_length
        return {key: f"{1 / factor if invert else factor:g}"}
    return overrides


# (name, citation, rule, overrides(length, L)): rope's training-free extensions, on the rope run
EXTENSIONS = (
    ("PI", "Chen et al. 2023", "pi_factor = L / L_valid", _scale("posenc.rope.pi_factor", invert=True)),
    ("NTK-aware", "bloc97 2023", "ntk_alpha = L_valid / L", _scale("posenc.rope.ntk_alpha")),
    ("dynamic NTK", "emozilla 2023", "dynamic_ntk with factor f = 2 at every length: alpha = 2 n / L - 1 for a "
     "window of n tokens (f = 1 would be NTK-aware's alpha = n / L, the row above)",
     lambda length, train_length: {"posenc.rope.dynamic_ntk": "true", "posenc.rope.dynamic_ntk_factor": "2"}),
    ("YaRN", "Peng et al. 2023", "yarn_scale = L_valid / L", _scale("posenc.rope.yarn_scale")),
    ("Llama 3", "Meta 2024", "llama3_factor = L_valid / L (low / high frequency factors 1 / 4)",
     _scale("posenc.rope.llama3_factor")),
    ("ReRoPE", "Su 2023", "rerope_window = L / 2 at every length",
     lambda length, train_length: {"posenc.rope.rerope_window": str(train_length // 2)}),
    ("Self-Extend", "Jin et al. 2024", "self_extend_window W = L / 2, self_extend_group G = ceil((L_valid - W) "
     "/ (L - W)), the smallest G whose largest relative position W + (L_valid - W) / G is <= L "
     "(1, 3, 7, 15, 31 at 1, 2, 4, 8, 16 L)", _self_extend),
    ("DCA", "An et al. 2024", "dca_chunk_size = 3 L / 4, dca_local_window = L / 16 at every length (ChunkLlama's "
     "chunk of 3/4 of the pretraining window)",
     lambda length, train_length: {"posenc.rope.dca_chunk_size": str(3 * train_length // 4),
                                   "posenc.rope.dca_local_window": str(train_length // 16)}),
    ("LM-Infinite", "Han et al. 2024", "model.attention_sinks = 10, attention_window = L (0) at every length",
     lambda length, train_length: {"model.attention_sinks": "10"}),
)


def rows() -> list[Row]:
    """Every registered scheme, the wrappers around alibi, rope with p_rope and rope's extensions."""
    out = [Row(name, name, name) for name in posenc.names()]
    for wrapper in ("logn", "randomized"):
        out.append(Row(f"{wrapper} [alibi]", f"{wrapper}_alibi", wrapper, ((f"posenc.{wrapper}.base", "alibi"),),
                       rule=f"trained with posenc.{wrapper}.base = alibi"))
    out.append(Row("rope p-RoPE 0.75", "rope_p0.75", "rope", (("posenc.rope.p_rope", "0.75"),),
                   rule="trained with posenc.rope.p_rope = 0.75: the highest 75% of the frequencies rotate",
                   cite="p-RoPE: Barbero et al. 2025"))
    out += [Row(f"rope + {name}", "rope", "rope", overrides=fn, rule=rule, cite=f"{name}: {cite}")
            for name, cite, rule, fn in EXTENSIONS]
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


# --- what is done already ---------------------------------------------------------------------

def _latest(run: RunDir, kind: str) -> list[dict]:
    """The run's records of one kind from its newest checkpoint."""
    step = run.latest_step()
    return [r for r in run.records(kind) if r.get("step") == step]


def missing_perplexity(run: RunDir, config: Config, overrides: dict, lengths) -> list[int]:
    spec = eval_spec(config)
    done = {records.record_key(r) for r in _latest(run, "perplexity")}
    return [n for n in lengths if records.record_key(
        {"split": spec.split, "eval_length": n, "stride": spec.stride or n, "max_tokens": spec.max_tokens,
         "overrides": overrides}) not in done]


def missing_passkey(run: RunDir, config: Config, overrides: dict, lengths, spec: PasskeySpec) -> list[int]:
    digits = int(config.data.passkey_digits if spec.digits is None else spec.digits)
    done = {records.passkey_key(r) for r in _latest(run, "passkey")}
    return [n for n in lengths if any(records.passkey_key(
        {"eval_length": n, "depth": d, "digits": digits, "overrides": overrides}) not in done for d in spec.depths)]


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

class _Clock:
    """Wall and process CPU seconds of a phase, added to ROOT/timings.json under the run's name."""

    def __init__(self, root: pathlib.Path, run: str, phase: str):
        self.path, self.run, self.phase = root / report.TIMINGS, run, phase

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        times = json.loads(self.path.read_text()) if self.path.exists() else {}
        entry = times.setdefault(self.run, {})
        for key, value in ((f"{self.phase}_wall_s", time.perf_counter() - self.wall),
                           (f"{self.phase}_cpu_s", time.process_time() - self.cpu)):
            entry[key] = entry.get(key, 0.0) + value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(times, indent=1, sort_keys=True))
        return False


def evaluate_row(row: Row, run: RunDir, config: Config, spec: PasskeySpec) -> dict[str, str]:
    """Perplexity and passkey retrieval of one row at every length it lacks; returns {length: why}
    for the lengths it cannot have. Lengths sharing the row's overrides are evaluated in one call."""
    L, lengths = config.train.seq_len, config.eval.lengths
    by_overrides: dict[str, tuple[dict, list[int]]] = {}
    for n in lengths:
        overrides = row.overrides_at(n, L)
        by_overrides.setdefault(json.dumps(overrides, sort_keys=True), (overrides, []))[1].append(n)
    cannot = {}
    for overrides, group in by_overrides.values():
        cannot.update(impossible(run, config, overrides, group))
        possible = [n for n in group if n not in cannot]
        todo = missing_perplexity(run, config, overrides, possible)
        if todo:
            log.info("%s: perplexity at %s%s", row.name, todo, f" with {overrides}" if overrides else "")
            evaluate(run.path, todo, overrides=overrides, skip_impossible=True)
        todo = missing_passkey(run, config, overrides, possible, spec)
        if todo:
            log.info("%s: passkey retrieval at %s%s", row.name, todo, f" with {overrides}" if overrides else "")
            evaluate_passkey(run.path, todo, spec, overrides=overrides, skip_impossible=True)
    return {str(n): why for n, why in cannot.items()}


def build(base: ml_collections.ConfigDict, root: str | pathlib.Path, out: str | pathlib.Path | None = None,
          only: list[str] | None = None, spec: PasskeySpec = PasskeySpec()) -> dict:
    """Train and evaluate every row's run under `root` (only the runs named in `only`, if given),
    then write the report to `out` (default ROOT/report). Returns the report's paths and the
    runs that failed ({run: error})."""
    root = pathlib.Path(root)
    out = pathlib.Path(out) if out else root / "report"
    table = rows()
    configs = {}
    for row in table:  # every config resolved first: a typo fails before hours of training
        if row.run not in configs:
            configs[row.run] = run_config(base, row.scheme, None, dict(row.settings))
    unknown = sorted(set(only or []) - set(configs))
    if unknown:
        raise ValueError(f"--schemes {', '.join(unknown)}: no such run in the table; valid: {', '.join(configs)}")
    manifest = {"protocol": protocol(configs["rope"], spec),
                "rows": [describe_row(row, configs[row.run]) for row in table]}
    cannot_by_row: dict[str, dict] = {}
    failed: dict[str, str] = {}
    selected = [name for name in configs if not only or name in only]
    for i, name in enumerate(selected, 1):
        config, run = configs[name], RunDir(root / name)
        log.info("[%d/%d] %s", i, len(selected), run.path)
        try:
            latest = run.latest_step()
            if latest is not None and latest > config.train.steps:
                raise ValueError(f"{run.path} is trained to step {latest}, beyond train.steps = {config.train.steps}: "
                                 f"every row is trained alike; give another --workdir or move that run away")
            if not is_trained(run, config):
                with _Clock(root, name, "train"), opened(run.path, "training") as opened_run:
                    train(config, opened_run)
            with _Clock(root, name, "eval"):
                for row in (r for r in table if r.run == name):
                    cannot_by_row[row.name] = evaluate_row(row, RunDir(run.path), config, spec)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - one scheme's failure must not stop the table
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            log.error("%s failed; going on with the next run:\n%s", name, traceback.format_exc())
        paths = _write(root, out, manifest, table, cannot_by_row, failed)
    if not selected:
        paths = _write(root, out, manifest, table, cannot_by_row, failed)
    return {**paths, "failed": failed}


def _write(root: pathlib.Path, out: pathlib.Path, manifest: dict, table: list[Row], cannot_by_row: dict,
           failed: dict) -> dict:
    """The manifest with each row's impossible lengths (or its run's failure), then the report."""
    previous = report.read_manifest(root) if (root / report.MANIFEST).exists() else {"rows": []}
    kept = {r["name"]: r.get("cannot", {}) for r in previous["rows"]}  # rows not run this time keep theirs
    for row, entry in zip(table, manifest["rows"]):
        if row.run in failed:
            entry["cannot"] = {n: f"{row.run} failed: {failed[row.run]}" for n in entry["overrides"]}
        else:
            entry["cannot"] = cannot_by_row.get(row.name, kept.get(entry["name"], {}))
    root.mkdir(parents=True, exist_ok=True)
    (root / report.MANIFEST).write_text(json.dumps(manifest, indent=1))
    return report.write(root, out)


def protocol(config: Config, spec: PasskeySpec) -> dict:
    """What every row shares, as the report states it."""
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
