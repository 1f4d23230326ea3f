"""The registry of evaluation kinds, and one evaluation command over any of them.

The kinds are the record kinds of experiment/store/records.py (`KINDS`: perplexity, passkey,
attention, ruler), in that order; each one's scoring lives in experiment/evals/<kind>.py, which ends with
its entry `KIND` (an `EvalKind`): the flags it reads (eval_extrapolate.py defines them, and refuses
one given for no kind it evaluates), the check of its request, its scoring and its printed line per
record. `evaluate_kinds(workdir, kinds, request)` opens the run and holds it once, checks every
kind's request before any of them runs (a bad passkey depth or --set value is refused before the
perplexity evaluation, not after it), restores the checkpoint once and hands it to each kind.
Whether a length is already evaluated is each kind's `recorded` (`unscored`), asked before the
checkpoint is restored, so that a command with nothing left to score restores nothing.
"""
from __future__ import annotations

import dataclasses
import importlib
import pathlib
from typing import Any, Callable, Sequence

import posenc
from experiment.config import Config
from experiment.evals import methods
from experiment.evals.common import Scoring, apply_overrides, eval_spec, load_checkpoint, opened_for_scoring
from experiment.model import abstract_model
from experiment.store import records
from experiment.store.run import RunDir
from posenc.domains import Domain


@dataclasses.dataclass(frozen=True)
class Option:
    """A flag of eval_extrapolate.py that a kind reads: a number or list of numbers (`kind`, checked
    against `domain` as it is parsed), or one of `choices` (with `sequence`: a comma-separated list
    of them). Default None: the run's config says."""
    name: str
    default: Any
    help: str
    kind: type = int
    domain: Domain | None = None
    example: str = ""
    sequence: bool = False
    choices: tuple[str, ...] = ()


SPLIT = Option("split", None, "perplexity, attention: split to score (default: config.eval.split)",
               kind=str, choices=("train", "valid", "test"))


@dataclasses.dataclass(frozen=True)
class Request:
    """What one command evaluates, for every kind it asks for. `lengths` None: the run's
    config.eval.lengths; `overrides` None: config.eval.overrides; `batch_tokens` None:
    config.eval.batch_tokens. `options`: {option name: value} of the kinds' options (an absent
    or None one takes its default), e.g. {"stride": 8, "passkey_depths": (0.0, 1.0)}."""
    lengths: tuple[int, ...] | None = None
    overrides: dict | None = None
    batch_tokens: int | None = None
    skip_impossible: bool = False  # lengths the scheme cannot encode are skipped with a warning, not refused
    options: dict = dataclasses.field(default_factory=dict)
    methods: tuple[str, ...] = ()  # training-free methods (experiment/evals/methods.py), each evaluated in turn
    skip_done: bool = False        # lengths this checkpoint's records already hold with the same settings: skipped
    # ((overrides, lengths), ...): evaluated in turn on the one checkpoint in place of `lengths` and
    # `overrides` (the table of every scheme: each row's eval-time options at its lengths)
    groups: tuple[tuple[dict, tuple[int, ...]], ...] = ()

    def option(self, option: Option):
        value = self.options.get(option.name)
        return option.default if value is None else value


@dataclasses.dataclass(frozen=True)
class Target:
    """What every kind of one command scores: the run, its config, the lengths and the overrides."""
    run: RunDir
    config: Config
    lengths: tuple[int, ...]
    overrides: dict


@dataclasses.dataclass(frozen=True)
class EvalKind:
    """One evaluation kind: `name` (its record kind and its flag, --<name>), that flag's `help`, the
    `options` it reads, `check(target, request)` -> its settings (raising what is wrong before any
    scoring), `score(scoring, settings, batch_tokens)` -> its records (written as it goes), `line(record)`
    -> the line eval_extrapolate.py prints. `default`: evaluated when a command names no kind;
    `what`: the word of its warning for a skipped length. `recorded(records, header, settings)` ->
    {length: the records that stand for its evaluation} where `records` already hold one with these
    settings and the header's checkpoint step, method and overrides (`Request.skip_done`, and a
    method whose options equal an evaluation's already recorded); None: never skipped."""
    name: str
    help: str
    options: tuple[Option, ...]
    check: Callable[[Target, Request], Any]
    score: Callable[[Scoring, Any, int], list[dict]]
    line: Callable[[dict], str]
    what: str
    default: bool = False
    aliases: tuple[str, ...] = ()
    recorded: Callable[[list[dict], dict, Any], dict[int, list[dict]]] | None = None


def same_evaluation(record: dict, header: dict) -> bool:
    """Whether a record comes from the checkpoint, method and overrides of `header` (Scoring.header)."""
    return (record.get("step") == header["step"] and record.get("method") == header.get("method")
            and record.get("overrides", {}) == header.get("overrides", {}))


def registry() -> dict[str, EvalKind]:
    """Every evaluation kind, in the order of the record kinds: experiment.evals.<kind>.KIND."""
    kinds = {}
    for name in records.KINDS:
        entry = getattr(importlib.import_module(f"experiment.evals.{name}"), "KIND", None)
        if not isinstance(entry, EvalKind) or entry.name != name:
            raise TypeError(f"experiment/evals/{name}.py must end with KIND = EvalKind({name!r}, ...): the "
                            f"registry entry of the record kind {name!r} (experiment/store/records.py)")
        kinds[name] = entry
    return kinds


def acts_on(kinds: dict[str, EvalKind]) -> dict[str, tuple[str, ...]]:
    """{option name: the kinds that read it}: a flag given for none of the kinds asked would be ignored."""
    out: dict[str, tuple[str, ...]] = {}
    for kind in kinds.values():
        for option in kind.options:
            out[option.name] = out.get(option.name, ()) + (kind.name,)
    return out


def options(kinds: dict[str, EvalKind]) -> list[Option]:
    """Every kind's options, each once (two kinds may read one: --split)."""
    return list({option.name: option for kind in kinds.values() for option in kind.options}.values())


def chosen(kinds: Sequence[str]) -> list[EvalKind]:
    """The registry entries of `kinds`, in the registry's order; an unknown or empty list is refused."""
    known = registry()
    unknown = [k for k in kinds if k not in known]
    if unknown or not kinds:
        raise ValueError(f"evaluation kinds are {', '.join(known)}; got {list(kinds) or 'none'}")
    return [entry for name, entry in known.items() if name in kinds]


def _checked(run: RunDir, config: Config, entries: list[EvalKind], request: Request) -> tuple[Target, dict]:
    """(the target, {kind: its settings}): the lengths, the overrides and every kind's options checked."""
    spec = eval_spec(config, request.lengths, stride=0, overrides=request.overrides)
    apply_overrides(config, spec.overrides)
    target = Target(run, config, spec.lengths, spec.overrides)
    return target, {entry.name: entry.check(target, request) for entry in entries}


def _groups(run: RunDir, config: Config, entries: list[EvalKind],
            request: Request) -> list[tuple[str | None, Target, dict]]:
    """[(method or None, target, {kind: settings})]: the request itself, or with `methods` one per method
    and set of options it takes at the lengths (experiment/evals/methods.py, relative to the run's
    training length), each checked. A method's name in its records is followed by the command's own
    --set options where there are any ("yarn [model.attention=dense]"): another curve."""
    if request.groups:
        if request.methods:
            raise ValueError("a request of groups of overrides and lengths takes no methods")
        return [(None, *_checked(run, config, entries, dataclasses.replace(
            request, lengths=tuple(lengths), overrides=dict(overrides), groups=())))
            for overrides, lengths in request.groups]
    if not request.methods:
        return [(None, *_checked(run, config, entries, request))]
    methods.check_run(request.methods, posenc.used_schemes(config.posenc), str(run.path))
    spec = eval_spec(config, request.lengths, stride=0, overrides=request.overrides)
    base = ", ".join(f"{key}={value}" for key, value in sorted(spec.overrides.items()))
    out = []
    for method, overrides, lengths in methods.plan(request.methods, spec.lengths, int(config.train.seq_len),
                                                   spec.overrides):
        one = dataclasses.replace(request, lengths=lengths, overrides=overrides, methods=())
        out.append((f"{method} [{base}]" if base else method, *_checked(run, config, entries, one)))
    return out


def check_request(workdir: str | pathlib.Path | RunDir, kinds: Sequence[str], request: Request) -> None:
    """Raise unless every kind of `kinds` can start on the run with `request`: the run and its
    checkpoint, the lengths and the overrides (of every method asked), each kind's options (a length
    the scheme cannot encode is reported when the checkpoint is loaded)."""
    entries = chosen(kinds)
    run = workdir if isinstance(workdir, RunDir) else RunDir(workdir)
    run.require_checkpoint()
    _groups(run, run.load_config(), entries, request)


def evaluate_kinds(workdir: str | pathlib.Path | RunDir, kinds: Sequence[str], request: Request = Request(), *,
                   say: Callable[[str], None] | None = None) -> dict[str, list[dict]]:
    """{kind: its new records} for each of `kinds`, scored on the run's newest readable checkpoint,
    restored once for all of them (and for every method: its options change no parameter); every
    kind's request, for every method, is checked before any scoring. `say` gets each record's line
    (`EvalKind.line`) as its kind finishes. With `request.skip_done`, the lengths whose records the run
    already holds with the same settings are not scored again (a repeated command resumes)."""
    entries = chosen(kinds)
    results: dict[str, list[dict]] = {entry.name: [] for entry in entries}
    with opened_for_scoring(workdir, "evaluation") as (run, config):
        groups = _groups(run, config, entries, request)
        what = " and ".join(e.what for e in entries)
        scoring = None
        for method, target, settings in groups:
            if request.skip_done and not _left(run, entries, method, target, settings, request.skip_impossible):
                if say:  # a resumed command says what it found done, rather than nothing
                    say(already_recorded(" and ".join(e.name for e in entries), method, target))
                continue  # every record there: the checkpoint is not restored for it
            if scoring is None:
                scoring = load_checkpoint(run, config, target.lengths, target.overrides,
                                          skip_impossible=request.skip_impossible, what=what)
            else:
                scoring = scoring.with_overrides(config, target.lengths, target.overrides,
                                                 skip_impossible=request.skip_impossible, what=what)
            scoring = dataclasses.replace(scoring, method=method)
            batch_tokens = int(request.batch_tokens or scoring.config.eval.batch_tokens)
            for entry in entries:
                lengths, new = list(scoring.lengths), []
                if entry.recorded is not None:
                    header, recs = scoring.header(), run.records(entry.name)
                    if request.skip_done:
                        lengths = unscored(entry, recs, header, settings[entry.name], lengths)
                    if method is not None:  # the same options as an evaluation recorded: its records, relabelled
                        same = _identical(entry, recs, header, settings[entry.name], lengths)
                        lengths = [n for n in lengths if n not in {int(r["eval_length"]) for r in same}]
                        scoring.write(entry.name, same)
                        new += same
                if lengths:
                    new += entry.score(dataclasses.replace(scoring, lengths=lengths), settings[entry.name],
                                       batch_tokens)
                results[entry.name] += new
                for record in new if say else ():
                    say(entry.line(record))
    return results


def already_recorded(kinds: str, method: str | None, target: Target) -> str:
    """The line of a group --skip_done skips whole: 'recorded already with these settings, not scored
    again (--skip_done): perplexity, yarn, L_valid 16384'."""
    named = method or ", ".join(f"{k}={v}" for k, v in sorted(target.overrides.items())) or "as configured"
    lengths = ", ".join(str(n) for n in target.lengths)
    return f"recorded already with these settings, not scored again (--skip_done): {kinds}, {named}, L_valid {lengths}"


def unscored(entry: EvalKind, recs: list[dict], header: dict, settings, lengths) -> list[int]:
    """The lengths of `lengths` that `recs` hold no evaluation of with `header`'s checkpoint step,
    method and overrides and with `settings` (the kind's `recorded`): THE definition of "already
    evaluated", for --skip_done, a resumed sweep and the table of every scheme."""
    done = entry.recorded(recs, header, settings) if entry.recorded is not None else {}
    return [n for n in lengths if n not in done]


def _left(run: RunDir, entries: list[EvalKind], method: str | None, target: Target, settings: dict,
          skip_impossible: bool) -> bool:
    """Whether any kind has a length of `target` left to score on the run's newest checkpoint, asked
    before restoring it. A length the scheme cannot encode is left where it is refused (its error
    comes at the restore), not where it is skipped."""
    lengths = list(target.lengths)
    if skip_impossible:
        config = apply_overrides(target.config, target.overrides)
        scheme = abstract_model(config, run.tokenizer(config.data, write=False).vocab_size).scheme
        lengths = [n for n in lengths if _encodes(scheme, n)]
    header = {"step": run.latest_step(), "method": method,
              **({"overrides": target.overrides} if target.overrides else {})}
    return any(unscored(entry, run.records(entry.name), header, settings[entry.name], lengths) for entry in entries)


def _encodes(scheme, length: int) -> bool:
    try:
        scheme.check_length(length)
    except posenc.LengthError:
        return False
    return True


def _identical(entry: EvalKind, recs: list[dict], header: dict, settings, lengths: list[int]) -> list[dict]:
    """Records of `recs` at `lengths` from an evaluation with the same checkpoint, overrides and
    settings as `header`'s but another method (or none), relabelled as this method's, `same_as`
    naming the one evaluated: a method that sets nothing at a length (YaRN within the window) is the
    model evaluated as trained there, scored once."""
    others = [{**r, "method": header["method"], "same_as": r.get("same_as") or r.get("method") or "as trained"}
              for r in recs if r.get("method") != header["method"] and int(r["eval_length"]) in lengths]
    return [r for records_ in entry.recorded(others, header, settings).values() for r in records_]
