"""The runs a report draws: what each one is (scheme, training length, dataset, unit, options, origin)
and the label that names it in legends and tables, read from its run directory (no scoring code)."""
from __future__ import annotations

import pathlib
import re

import posenc
from experiment.run import RunDir

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
    passkey_fraction, run (its RunDir)}."""
    run = workdir if isinstance(workdir, RunDir) else RunDir(workdir)
    workdir = run.path
    config = run.load_config()
    text = _dataset_text(config.data)
    return {"scheme": config.posenc.name, "train_length": int(config.train.seq_len),
            "dataset": dataset_name(config.data), "wikitext": "wikitext" in text,
            "wikitext103": bool(re.search(r"(wikitext|wt)[-_ ]?103", text)),
            "tokenizer": config.data.tokenizer, "workdir": str(workdir), "run": run,
            "passkey_fraction": float(config.data.passkey_fraction),
            "options": scheme_options_note(config.posenc), "origin": run.origin()}


def label_runs(runs: list[dict]) -> list[dict]:
    """Give each run its `label`: 'scheme (L=64, options, from base@step, dataset)', the dataset only
    when the runs do not share one, and the folder name where two labels would be equal."""
    several = len({run["dataset"] for run in runs}) > 1
    for run in runs:
        extra = [run["options"]] if run["options"] else []
        if run["origin"]:
            extra.append(f"from {pathlib.Path(run['origin']['workdir']).name}@{run['origin']['step']}")
        if several:
            extra.append(run["dataset"])
        run["label"] = f"{run['scheme']} (L={run['train_length']}" + "".join(f", {e}" for e in extra) + ")"
    labels = [r["label"] for r in runs]
    for run in runs:  # same scheme, L and dataset in two workdirs: tell them apart by folder name
        if labels.count(run["label"]) > 1:
            run["label"] += f" [{pathlib.Path(run['workdir']).name}]"
    return runs


def title(what: str, runs: list[dict], details: str = "", labels_in: str = "legend") -> str:
    """'WHAT on DATASET, DETAILS', or 'WHAT (datasets differ: see legend), DETAILS'."""
    datasets = sorted({run["dataset"] for run in runs})
    return (what + (f" on {datasets[0]}" if len(datasets) == 1 else f" (datasets differ: see {labels_in})")
            + (f", {details}" if details else ""))
