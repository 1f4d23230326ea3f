"""A study: one imported model evaluated in many cells, or models trained here and evaluated by a few
commands, written as a config (configs/studies/NAME.py) and run by one command (study.py,
experiment/study/run.py and steps.py):

    python study.py configs/studies/ruler_smollm2.py             # every cell; a second call resumes
    python study.py configs/studies/ruler_smollm2.py --check     # the check cells, compared with the records
    python study.py configs/studies/far_needles_smollm2.py --param questions=48

A study config defines `PARAMS` (its knobs and their defaults: the number of examples, the methods)
and `get_study(params) -> Study`. A `Cell` is what one `eval_extrapolate.py` command scores (its
kinds, lengths, methods, --set overrides and the kinds' options, by the flag names), evaluated through
experiment.evals.kinds.evaluate_kinds with --skip_done, so that a repeated or interrupted study goes on
where it stopped. `Cell.command()` is that command, for the log and the README.

A study of models trained here (`TrainingStudy`: the demo-scale tables, the reduced-scale reproduction)
is its `steps`: the project's own commands (train.py, sweep.py, eval_extrapolate.py, report.py, ...)
in order, each of which resumes (a trained run is not trained again, --skip_done), and its check steps
(one scheme again in a new folder, report.py --compare_with the committed tables).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
from typing import Any

@dataclasses.dataclass(frozen=True)
class Cell:
    """One evaluation command's worth: `kinds` (perplexity, passkey, ruler, ...) at `lengths` for each
    of `methods` (none: the model as trained), with `overrides` (--set) and the kinds' `options`
    ({flag name: value}, e.g. {"ruler_tasks": ("vt",), "samples": 4}). `best_of` (count, length): the
    methods are instead the `count` best at `length` by their mean RULER score in the run's records.
    `batch_tokens`: tokens a batch (eval_extrapolate.py --batch_tokens; None: the config's)."""
    kinds: tuple[str, ...]
    lengths: tuple[int, ...]
    methods: tuple[str, ...] = ()
    options: dict = dataclasses.field(default_factory=dict)
    overrides: dict = dataclasses.field(default_factory=dict)
    best_of: tuple[int, int] | None = None
    batch_tokens: int | None = None

    def command(self, workdir: str = "W", methods: tuple[str, ...] | None = None) -> str:
        """The eval_extrapolate.py command that scores this cell."""
        def value(v):
            return ",".join(str(x) for x in v) if isinstance(v, (tuple, list)) else str(v)
        chosen = self.methods if methods is None else methods
        parts = [f"python eval_extrapolate.py --workdir {workdir}", *(f"--{k}" for k in self.kinds if k != "perplexity")]
        parts += [f"--{k} {value(v)}" for k, v in self.options.items()]
        parts += [f"--set {k}={v}" for k, v in self.overrides.items()]
        parts += [f"--batch_tokens {self.batch_tokens}"] if self.batch_tokens else []
        parts += [f"--lengths {value(self.lengths)}"]
        if self.best_of:
            parts.append(f"--methods <the {self.best_of[0]} best at {self.best_of[1]:,}>" if methods is None
                         else f"--methods {value(chosen)}")
        elif chosen:
            parts.append(f"--methods {value(chosen)}")
        return " ".join(parts + ["--skip_done"])


@dataclasses.dataclass(frozen=True)
class Study:
    """An imported model (`model`: what import_hf.py takes, `data`: its evaluation data, import_hf's
    --data_*) scored in `cells`, in order; `needs`: what it installs where missing (a packaged model's
    name, or "books": experiment/study/run.py, REQUIREMENTS); `records`: the kinds whose
    records results/NAME/records/ keeps; `reports`: "runs" (report.py's tables and figures), "ruler"
    (the RULER report), "needles" (each needle by its distance back); `check`: cells re-run in a new
    run folder and compared with the committed records (`tolerance`: absolute for accuracies and
    scores, relative for perplexities); `quick`: a short version of the study, into its own folder,
    on the demo's built-in corpus (whatever `data` says)."""
    name: str
    model: str
    cells: tuple[Cell, ...]
    records: tuple[str, ...]
    reports: tuple[str, ...]
    needs: tuple[str, ...] = ()
    data: dict = dataclasses.field(default_factory=dict)
    check: tuple[Cell, ...] = ()
    tolerance: float = 0.0
    quick: tuple[Cell, ...] = ()


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of a TrainingStudy: `argv`, a project entry point (ENTRY_POINTS: "train.py", ..., or
    "-m" and a module of the project) and its arguments, "{W}" and "{OUT}" in them standing for the run
    folder and the result folder; or `copy` = (a glob of files under W, a folder under OUT), copied.
    `done_if`: a path (with {W}) whose existence means the step has run (for a command that would not
    resume by itself, such as an import)."""
    argv: tuple[str, ...] = ()
    copy: tuple[str, str] | None = None
    done_if: str | None = None

    def filled(self, workdir: str = "W", out: str = "OUT") -> tuple[str, ...]:
        return tuple(a.replace("{W}", workdir).replace("{OUT}", out) for a in self.argv)

    def command(self, workdir: str = "W", out: str = "OUT") -> str:
        """The command as one types it (for the log, --dry_run and the README)."""
        if self.copy:
            return f"cp {self.copy[0].replace('{W}', workdir)} {self.copy[1].replace('{OUT}', out)}"
        return "python " + " ".join(self.filled(workdir, out))


ENTRY_POINTS = ("train.py", "sweep.py", "eval_extrapolate.py", "report.py", "export_hf.py", "import_hf.py", "-m")


@dataclasses.dataclass(frozen=True)
class TrainingStudy:
    """Models trained here and evaluated by `steps`, in order (each resumes where it stopped: a second
    call does only what is missing); `check`: steps that re-run part of it in a new run folder and
    compare with the committed tables (a step that fails, such as report.py --compare_with beyond its
    tolerance, fails the check)."""
    name: str
    steps: tuple[Step, ...]
    check: tuple[Step, ...] = ()
    quick: tuple = ()  # (none: every step here is already at demo scale)


def load(path: str | pathlib.Path, params: dict[str, str] | None = None) -> tuple[Study | TrainingStudy, dict]:
    """(the study of the config file `path` with `params` over its PARAMS, the params used); an
    unknown param, or a value not of its default's type, is a ValueError naming --param. Its cells
    are checked against the registries by experiment.study.run.check (this package reaches no JAX)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such study config; the studies: configs/studies/*.py")
    spec = importlib.util.spec_from_file_location(f"study_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    used = dict(module.PARAMS)
    for key, text in (params or {}).items():
        if key not in used:
            raise ValueError(f"--param {key}: {path} has no such param; its params: {', '.join(used)}")
        used[key] = _typed(key, text, used[key])
    return module.get_study(used), used


def _typed(key: str, text: str, default: Any):
    try:
        return type(default)(text) if not isinstance(default, bool) else text.lower() in ("1", "true", "yes")
    except ValueError:
        raise ValueError(f"--param {key}={text}: not of the type of its default, {default!r}") from None
