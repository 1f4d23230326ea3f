"""Passkey retrieval plots and tables: accuracy against evaluation length (mean over depths, one
line per run), a length x depth heat map per run, and markdown tables.

`runs` is a list of (label, records), records as experiment/evals/passkey.py writes them. A run whose
records hold several series (other digits, eval-time overrides) gets one line per series.
"""
from __future__ import annotations

import json
import pathlib
from collections import defaultdict

import numpy as np

from experiment.report import plots
from experiment.report.runs import describe, distinguish, file_stems, name_runs
from experiment.store.records import curve_options


def _series(records: list[dict]) -> dict[tuple, list[dict]]:
    """{(digits, curve options json, checkpoint step): records}, in a stable order (newest step first);
    records of two checkpoints are two series, never averaged together."""
    out = defaultdict(list)
    for r in records:
        out[(int(r.get("digits", 4)), curve_options(r), r.get("step"))].append(r)
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], kv[0][1], -(kv[0][2] or 0))))


def _series_label(label: str, key: tuple, groups: dict) -> str:
    """The run's label, with what sets this series apart from the run's others."""
    digits, overrides, step = key
    extra = []
    if len({k[:2] for k in groups}) > 1:
        extra += [f"{digits} digits"] + [v if k == "method" else f"{k.split('.')[-1]}={v}"
                                         for k, v in sorted(json.loads(overrides).items())]
    if len({k[2] for k in groups}) > 1:
        extra.append(f"step {step}")
    return f"{label}, {', '.join(extra)}" if extra else label


def mean_by_length(records: list[dict]) -> dict[int, float]:
    """{eval_length: accuracy over every depth (weighted by count)}."""
    hits, counts = defaultdict(float), defaultdict(int)
    for r in records:
        hits[r["eval_length"]] += r["accuracy"] * r["count"]
        counts[r["eval_length"]] += r["count"]
    return {length: hits[length] / counts[length] for length in sorted(counts)}


def grid(records: list[dict]) -> tuple[list[int], list[float], dict[tuple[int, float], float]]:
    """(lengths, depths, {(length, depth): accuracy})."""
    hits, counts = defaultdict(float), defaultdict(int)
    for r in records:
        key = (int(r["eval_length"]), float(r["depth"]))
        hits[key] += r["accuracy"] * r["count"]
        counts[key] += r["count"]
    cells = {k: hits[k] / counts[k] for k in counts}
    return sorted({k[0] for k in cells}), sorted({k[1] for k in cells}), cells


def passkey_figure(runs: list[tuple[str, list[dict]]]):
    """Accuracy (mean over depths) against evaluation length, log2 x axis; training lengths dashed
    gray, chance (10^-digits: guessing the number) dotted."""
    fig = plots.figure((9, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    train_lengths, chances, i = set(), set(), 0
    for run, (label, records) in enumerate(runs):
        groups = _series(records)
        for key, recs in groups.items():
            points = mean_by_length(recs)
            ax.plot(list(points), list(points.values()), ms=4, label=_series_label(label, key, groups),
                    **plots.style(i, run))
            i += 1
            train_lengths |= {int(r["train_length"]) for r in recs if "train_length" in r}
            chances |= {10.0 ** -key[0]}
    plots.mark_train_lengths(ax, train_lengths)
    for chance in sorted(chances):
        ax.axhline(chance, color="black", ls=":", lw=0.8, label=f"chance ({chance:.0e}: guessing the number)")
    if i:
        plots.format_length_axis(ax)
    ax.set_ylim(-0.03, 1.03)
    plots.format_linear_axis(ax.yaxis)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("passkey accuracy (exact match, mean over depths)")
    ax.set_title("Passkey retrieval vs. evaluation length", fontsize=10)
    plots.legend_beside(ax)
    return fig


def heatmap_figure(label: str, records: list[dict]):
    """Accuracy of each (depth, length) cell, values written in the cells (records of one series;
    cells that several records share show their count-weighted mean)."""
    lengths, depths, cells = grid(records)
    values = np.full((len(depths), len(lengths)), np.nan)
    for (length, depth), acc in cells.items():
        values[depths.index(depth), lengths.index(length)] = acc
    width = 2.4 + 0.9 * max(1, len(lengths))
    fig = plots.figure((width, 1.6 + 0.5 * max(1, len(depths))))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for y in range(len(depths)):
        for x in range(len(lengths)):
            if not np.isnan(values[y, x]):
                ax.text(x, y, f"{values[y, x]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if 0.25 < values[y, x] < 0.85 else "white")
    ax.set_xticks(range(len(lengths)), [str(l) for l in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("key depth\n(0 = start, 1 = just before the question)", fontsize=9)
    train = sorted({int(r["train_length"]) for r in records if "train_length" in r})
    ax.set_title(plots.wrap(f"Passkey accuracy: {label}" + (f" (trained at L={', '.join(map(str, train))})"
                                                            if train else ""), int(width * 11)), fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.05)
    return fig


def passkey_table(runs: list[tuple[str, list[dict]]]) -> str:
    """Markdown: accuracy (mean over depths) with rows = evaluation length and columns = runs, then
    one length x depth table per run and series."""
    columns = []
    for label, records in runs:
        groups = _series(records)
        for key, recs in groups.items():
            columns.append((_series_label(label, key, groups), recs))
    lengths = sorted({int(r["eval_length"]) for _, recs in columns for r in recs})
    means = [mean_by_length(recs) for _, recs in columns]
    lines = ["### Passkey accuracy (exact match, mean over depths)", "",
             "| length | " + " | ".join(label for label, _ in columns) + " |", "|" + "---:|" * (len(columns) + 1)]
    for length in lengths:
        lines.append(f"| {length} | " + " | ".join(f"{m[length]:.2f}" if length in m else "" for m in means) + " |")
    counts = sorted({int(r["count"]) for _, recs in columns for r in recs})
    digits = sorted({int(r.get("digits", 4)) for _, recs in columns for r in recs})
    lines += ["", f"Examples per (length, depth) cell: {', '.join(map(str, counts))}; "
                  f"chance (guessing a {'/'.join(map(str, digits))}-digit number): "
                  f"{', '.join(f'{10.0 ** -d:.0e}' for d in digits)}.", ""]
    for label, recs in columns:
        lens, depths, cells = grid(recs)
        steps = sorted({int(r["step"]) for r in recs if "step" in r})
        lines += [f"### {label}: accuracy by length and depth" + (f" (step {', '.join(map(str, steps))})" if steps else ""),
                  "", "| depth | " + " | ".join(map(str, lens)) + " |", "|" + "---:|" * (len(lens) + 1)]
        for depth in depths:
            lines.append(f"| {depth:g} | " + " | ".join(
                f"{cells[(l, depth)]:.2f}" if (l, depth) in cells else "" for l in lens) + " |")
        lines.append("")
    return "\n".join(lines)


def run_label(run: dict) -> str:
    """'alibi (L=64, passkey 0.5)' from experiment/report/runs.py's description of a run."""
    fraction = run["passkey_fraction"]
    return f"{run['scheme']} (L={run['train_length']}" + (f", passkey {fraction:g})" if fraction else ")")


def write(workdirs: list[str | pathlib.Path | dict], out: str | pathlib.Path) -> dict:
    """OUT/passkey_vs_length.png, OUT/passkey_heatmap_<run>[_<series>].png per run and series, and
    OUT/passkey.md from the runs' eval/passkey.json (workdirs, or runs described by
    experiment/report/runs.py); runs without passkey results are refused by name. File names and
    labels of runs with one folder name carry the part of the path that tells them apart."""
    described = [w if isinstance(w, dict) else describe(w) for w in workdirs]
    if not all("name" in run for run in described):
        name_runs(described)
    runs, missing = [], []
    for run in described:
        records = run["run"].records("passkey")
        if not records:
            missing.append(str(run["workdir"]))
        runs.append({"label": run_label(run), "name": run["name"], "file": run["file"], "records": records})
    if missing:
        raise FileNotFoundError(f"no eval/passkey.json in {', '.join(missing)}; evaluate passkey retrieval there "
                                f"first (python eval_extrapolate.py --workdir DIR --passkey)")
    distinguish(runs)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots.save(passkey_figure([(run["label"], run["records"]) for run in runs]), out / "passkey_vs_length.png")
    heatmaps = []
    for run in runs:
        groups = _series(run["records"])
        for key, recs in groups.items():
            name = _series_label(run["label"], key, groups)
            extra = _series_label("", key, groups).lstrip(", ")
            path = out / f"passkey_heatmap_{run['file']}{'_' + file_stems([extra])[0] if extra else ''}.png"
            plots.save(heatmap_figure(name, recs), path)
            heatmaps.append(str(path))
    (out / "passkey.md").write_text("# Passkey retrieval vs. evaluation length\n\n"
                                    + passkey_table([(run["label"], run["records"]) for run in runs]))
    return {"png": str(out / "passkey_vs_length.png"), "md": str(out / "passkey.md"), "heatmaps": heatmaps}


def report(runs: list[dict], out: str | pathlib.Path) -> dict:
    """The passkey part of a report (experiment/report/__init__.py), for the runs that have passkey
    records: {"passkey": `write`'s paths}, or nothing when none has."""
    with_passkey = [run for run in runs if run["run"].records_path("passkey").exists()]
    return {"passkey": write(with_passkey, out)} if with_passkey else {}
