"""The runs a report draws: what each one is (scheme, training length, dataset, unit, options, origin)
and the label that names it in legends and tables, read from its run directory (no scoring code)."""
from __future__ import annotations

import os
import pathlib
import re
import shlex

import posenc
from experiment.report import seeds
from experiment.store import output
from experiment.store.run import RunDir, RunError

# tokenizer kind -> (name in titles, what one token is)
UNITS = {"byte": ("byte", "byte"), "bpe": ("BPE", "BPE token"), "word": ("word", "word"),
         "pretrained": ("pretrained-tokenizer", "token")}


def unit_names(unit: str) -> tuple[str, str]:
    return UNITS.get(unit, (unit, f"{unit} token"))


def dataset_name(data) -> str:
    """A run's dataset as shown: the HF name (/config), the builtin name, or the local folder name."""
    if data.source == "hf":
        return data.name + (f"/{data.hf_config}" if data.hf_config else "")
    return data.name if data.source == "builtin" else pathlib.Path(data.path).name


def _dataset_text(data) -> str:
    fields = [data.name, data.hf_config] if data.source in ("hf", "builtin") else [data.path]
    return " ".join(str(f) for f in fields).lower()


def scheme_options_note(posenc_cfg) -> str:
    """The options of the schemes a run uses that differ from their defaults: 'pi_factor=0.25'."""
    notes = []
    for name in posenc.used_schemes(posenc_cfg):
        defaults = posenc.default_config(name).get(name, {})
        given = posenc_cfg.get(name, {})
        notes += [f"{k}={given[k]:g}" if isinstance(given[k], float) else f"{k}={given[k]}"
                  for k in sorted(given.keys())
                  if k in defaults and given[k] != defaults[k] and k != "base"]
    return ", ".join(notes)


def describe(workdir: str | pathlib.Path | RunDir) -> dict:
    """{scheme, train_length, dataset, wikitext, wikitext103, tokenizer, workdir, options, origin,
    passkey_fraction, seed, config_key (what runs of one config but other seeds share:
    experiment/report/seeds.py), run (its RunDir)}."""
    run = workdir if isinstance(workdir, RunDir) else RunDir(workdir)
    workdir = run.path
    config = run.load_config()
    text = _dataset_text(config.data)
    return {"scheme": config.posenc.name, "train_length": int(config.train.seq_len),
            "dataset": dataset_name(config.data), "wikitext": "wikitext" in text,
            "wikitext103": bool(re.search(r"(wikitext|wt)[-_ ]?103", text)),
            "tokenizer": config.data.tokenizer, "workdir": str(workdir), "run": run,
            "passkey_fraction": float(config.data.passkey_fraction),
            "options": scheme_options_note(config.posenc), "origin": run.origin(),
            "seed": int(config.seed), "config_key": seeds.config_key(config.to_dict())}


def distinct_names(paths: list[str | pathlib.Path]) -> list[str]:
    """The shortest end of each run directory's path that no other one ends with: 'alibi_L64', or
    'A/alibi_L64' and 'B/alibi_L64' when runs/A/alibi_L64 and runs/B/alibi_L64 are compared. The
    same directory given twice is refused (it would be drawn twice under one name)."""
    seen = {}
    for path in paths:
        real = pathlib.Path(path).resolve()
        if real in seen:
            raise ValueError(f"{seen[real]} and {path} are the same run directory; give each run once")
        seen[real] = path
    parts = [pathlib.Path(os.path.abspath(p)).parts for p in paths]  # as given (a link keeps its name)
    names = []
    for i, p in enumerate(parts):
        n = next(n for n in range(1, len(p) + 1) if all(q[-n:] != p[-n:] for j, q in enumerate(parts) if j != i))
        names.append("/".join(p[-n:]))
    return names


def file_stems(names: list[str]) -> list[str]:
    """File-name-safe, distinct stems of distinct names ('A/alibi_L64' -> 'A_alibi_L64'); letters of
    any script are kept ('运行/甲' -> '运行_甲'), so that the files tell runs apart as their names do."""
    stems, taken = [], set()
    for name in names:
        stem = re.sub(r"[^\w.-]+", "_", name).strip("_.") or "run"
        unique, n = stem, 1
        while unique in taken:  # two names that differ only in characters a file name cannot hold
            n += 1
            unique = f"{stem}_{n}"
        taken.add(unique)
        stems.append(unique)
    return stems


def name_runs(runs: list[dict]) -> list[dict]:
    """Give each run its `name` (distinct_names) and `file` (the stem of the files written per run)."""
    names = distinct_names([run["workdir"] for run in runs])
    for run, name, stem in zip(runs, names, file_stems(names)):
        run["name"], run["file"] = name, stem
    return runs


def label_runs(runs: list[dict]) -> list[dict]:
    """Give each run its `name`, `file` (name_runs) and `label`: 'scheme (L=64, options, from
    base@step, dataset)', the dataset only when the runs do not share one, ', seed N' where runs of
    its config with other seeds are given too (experiment/report/seeds.py), and the run's name where
    two labels would be equal."""
    name_runs(runs)
    several = len({run["dataset"] for run in runs}) > 1
    for run in runs:
        extra = [run["options"]] if run["options"] else []
        if run["origin"]:
            extra.append(f"from {pathlib.Path(run['origin']['workdir']).name}@{run['origin']['step']}")
        if several:
            extra.append(run["dataset"])
        run["label"] = f"{run['scheme']} (L={run['train_length']}" + "".join(f", {e}" for e in extra) + ")"
    seeds.mark_members(runs)
    return distinguish(runs)


def distinguish(runs: list[dict], key: str = "label") -> list[dict]:
    """Runs whose `key` would be equal (same scheme, L and dataset in two folders) get their name
    added to it: 'alibi (L=64) [A/alibi_L64]'."""
    labels = [run[key] for run in runs]
    for run in runs:
        if labels.count(run[key]) > 1:
            run[key] += f" [{run['name']}]"
    return runs


def title(what: str, runs: list[dict], details: str = "", labels_in: str = "legend") -> str:
    """'WHAT on DATASET, DETAILS', or 'WHAT (datasets differ: see legend), DETAILS'."""
    datasets = sorted({run["dataset"] for run in runs})
    return (what + (f" on {datasets[0]}" if len(datasets) == 1 else f" (datasets differ: see {labels_in})")
            + (f", {details}" if details else ""))


def refuse_folders_of_runs(workdirs: list, out: str) -> None:
    """A folder given where a run is expected that is not one but holds runs (a sweep's root, given
    for its runs) is refused with the command that names its runs, each one: a glob `ROOT/*` would
    also take the sweep's own report/ folder, which is not a run."""
    for workdir in map(pathlib.Path, workdirs):
        if not workdir.is_dir() or RunDir(workdir).exists():
            continue
        if output.written_by(workdir):  # ROOT/* took the sweep's report folder
            others = " ".join(shlex.quote(str(w)) for w in workdirs if pathlib.Path(w) != workdir)
            raise RunError(f"{workdir} is a folder {output.written_by(workdir)} wrote, not a run: leave it out, "
                           f"python report.py {others or 'RUN ...'} --out {shlex.quote(str(out))}")
        inside = sorted(p for p in workdir.iterdir() if p.is_dir() and RunDir(p).exists())
        if inside:
            runs = " ".join(shlex.quote(str(p)) for p in inside)
            raise RunError(f"{workdir} is not a run but holds {len(inside)} runs (a sweep's folder?): give the "
                           f"runs, python report.py {runs} --out {shlex.quote(str(out))}")
