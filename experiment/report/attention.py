"""Figures of the attention statistics (experiment/evals/attention.py): how far each layer looks back
and how spread its attention is, by query position, at the longest length evaluated."""
from __future__ import annotations

import math
import pathlib

import numpy as np
from matplotlib.ticker import MaxNLocator

from experiment.report import plots
from experiment.report.runs import distinct_names, file_stems
from experiment.report.seeds import members

PANELS = (("mean_distance", "mean distance attended to", "tokens", "mean distance at the last positions"),
          ("entropy", "attention entropy", "nats", "entropy at the last positions"))


def attention_figure(records: list[dict], run_label: str, train_length: int | None = None):
    """Top: mean distance and entropy against query position (log x), one line per layer (mean over
    heads), dashed gray = uniform attention over the prefix (i/2 tokens, log(i+1) nats); a vertical
    line at the training length. Bottom: per layer x head, the value in the last position bin."""
    if not records:
        raise ValueError(f"no attention records for {run_label}; run eval_extrapolate.py --attention first")
    plain = [r for r in records if not r.get("overrides")] or records  # eval-time knobs off, where evaluated so
    record = max(plain, key=lambda r: (r["eval_length"], r.get("step", 0)))
    train_length = train_length or record.get("train_length")
    bins = record["positions"]
    xs = np.array([math.sqrt((a + 1) * (b + 1)) for a, b in bins])
    uniform = {"mean_distance": [np.mean(np.arange(a, b + 1) / 2) for a, b in bins],
               "entropy": [np.mean(np.log(np.arange(a, b + 1) + 1)) for a, b in bins]}
    layers, heads = record["layers"], record["heads"]

    fig = plots.figure((12, 4.5 + 0.35 * max(layers, 4)))
    axes = fig.subplots(2, 2, gridspec_kw={"height_ratios": [3, max(1.5, 0.35 * layers)]})
    for col, (name, what, unit, heat_title) in enumerate(PANELS):
        values_LxHxN = np.asarray(record[name], dtype=float)
        ax = axes[0, col]
        for layer in range(layers):
            ax.plot(xs, values_LxHxN[layer].mean(axis=0), ms=4, markevery=max(1, len(xs) // 8),
                    label=f"layer {layer}", **plots.style(layer))
        ax.plot(xs, uniform[name], "--", color="gray", lw=1, label="uniform over the prefix")
        if train_length:
            plots.mark_train_lengths(ax, [train_length], label="L_train", style=":")
        plots.format_length_axis(ax)
        plots.format_linear_axis(ax.yaxis)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel("query position in the window (index + 1)")
        ax.set_ylabel(f"{unit} (mean over heads)")
        ax.set_title(f"{run_label}, L_valid={record['eval_length']}: {what}", fontsize=10)
        ax.legend(fontsize=7)

        ax = axes[1, col]
        last_LxH = values_LxHxN[:, :, -1]
        image = ax.imshow(last_LxH, aspect="auto", cmap="viridis", interpolation="nearest")
        plots.format_linear_axis(fig.colorbar(image, ax=ax).ax.yaxis)
        ax.set_xticks(range(heads), [str(h) for h in range(heads)])
        ax.set_yticks(range(layers), [str(layer) for layer in range(layers)])
        ax.xaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        first, last = bins[-1]
        ax.set_title(f"{heat_title} ({unit}; positions {first}-{last})", fontsize=10)
    return fig


def write(runs: list[dict], out: str | pathlib.Path) -> list[str]:
    """OUT/attention_<run>.png for every run (experiment/report/runs.py's dicts: run, workdir,
    label, train_length, and `file` where name_runs gave one) whose WORKDIR/eval/attention.json
    holds records; the paths written. Two runs with one folder name get the part of their paths
    that tells them apart (A_alibi_L64, B_alibi_L64)."""
    stems = [run["file"] for run in runs] if all("file" in run for run in runs) else \
        file_stems(distinct_names([run["workdir"] for run in runs]))
    paths = []
    for run, stem in zip(runs, stems):
        records = run["run"].records("attention")
        if not records:
            continue
        fig = attention_figure(records, run["label"], run.get("train_length"))
        paths.append(str(plots.save(fig, pathlib.Path(out) / f"attention_{stem}.png")))
    return paths


def report(runs: list[dict], out: str | pathlib.Path) -> dict:
    """The attention part of a report (experiment/report/__init__.py): {"attention_pngs": paths}, one
    figure per run folder (each seed of a run of several its own)."""
    return {"attention_pngs": write([member for run in runs for member in members(run)], out)}
