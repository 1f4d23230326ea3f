"""Passkey retrieval plots and tables: accuracy against evaluation length (mean over depths, one
line per run), a length x depth heat map per run, and markdown tables.

`runs` is a list of (label, records), records as experiment/evals/passkey.py writes them. A run whose
records hold several series (other digits, eval-time overrides) gets one line per series. The records
of a run of several seeds (experiment/report/seeds.py) carry their seed as `train_seed`; a cell then
pools every key of every seed, with its 95% Wilson interval: a band in the line plot, [low, high] in
the tables, and in the heat map a mark on the cells whose interval holds the next shorter length's
value (no difference shown there). A run of one seed is drawn and tabulated as before. Records of the
generated form (experiment/evals/passkey.py: an instruction, the answer generated) are series of their
own, labelled "generated" ("generated, chat" in the model's chat template), never pooled with the
compact form's or each other's; their tables give every accuracy with its 95% Wilson interval over
the keys asked.
"""
from __future__ import annotations

import json
import pathlib
from collections import defaultdict

import numpy as np

from experiment.report import plots
from experiment.report.runs import describe, distinguish, file_stems, name_runs
from experiment.report.seeds import members, wilson
from experiment.store import files
from experiment.store.records import PASSKEY_FORMS, PASSKEY_GENERATED, curve_options, passkey_form

SAME_AS_SHORTER = "≈"  # the heat maps' mark: this cell's interval holds the next shorter length's value


def _series(records: list[dict]) -> dict[tuple, list[dict]]:
    """{(digits, curve options json, checkpoint step, form): records}, in a stable order (newest step
    first); records of two checkpoints, or of the two forms, are two series, never averaged together."""
    out = defaultdict(list)
    for r in records:
        out[(int(r.get("digits", 4)), curve_options(r), r.get("step"), passkey_form(r))].append(r)
    order = {form: i for i, form in enumerate(PASSKEY_FORMS)}
    return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0][3], len(order)), kv[0][0], kv[0][1],
                                                    -(kv[0][2] or 0))))


def generated(records: list[dict]) -> bool:
    """Records of a generated form, plain or chat (one series holds one form)."""
    return any(r.get("form") in PASSKEY_GENERATED for r in records)


def _series_label(label: str, key: tuple, groups: dict) -> str:
    """The run's label, with what sets this series apart from the run's others; 'generated' for the
    generated form's, always ('generated, chat' in the chat template)."""
    digits, overrides, step, form = key
    extra = {"generated": ["generated"], "chat": ["generated", "chat"]}.get(form, [])
    if len({k[:2] for k in groups if k[3] == form}) > 1:
        extra += [f"{digits} digits"] + [v if k == "method" else f"{k.split('.')[-1]}={v}"
                                         for k, v in sorted(json.loads(overrides).items())]
    if len({k[2] for k in groups}) > 1:
        extra.append(f"step {step}")
    return f"{label}, {', '.join(extra)}" if extra else label


def several_seeds(records: list[dict]) -> int:
    """How many training seeds the records pool (0 or 1: a run of one seed)."""
    return len({r["train_seed"] for r in records if "train_seed" in r})


def _pooled(records: list[dict], key) -> dict:
    """{key(record): (keys retrieved, keys asked)} over every record (every depth, every seed)."""
    hits, counts = defaultdict(float), defaultdict(int)
    for r in records:
        hits[key(r)] += r["accuracy"] * r["count"]
        counts[key(r)] += r["count"]
    return {k: (hits[k], counts[k]) for k in counts}


def mean_by_length(records: list[dict]) -> dict[int, float]:
    """{eval_length: accuracy over every depth (weighted by count)}."""
    pooled = _pooled(records, lambda r: r["eval_length"])
    return {length: hits / count for length, (hits, count) in sorted(pooled.items())}


def interval_by_length(records: list[dict]) -> dict[int, tuple[float, float]]:
    """{eval_length: the 95% Wilson interval of its accuracy over every key of every depth and seed}."""
    pooled = _pooled(records, lambda r: r["eval_length"])
    return {length: wilson(hits, count) for length, (hits, count) in sorted(pooled.items())}


def grid(records: list[dict]) -> tuple[list[int], list[float], dict[tuple[int, float], float]]:
    """(lengths, depths, {(length, depth): accuracy})."""
    cells = {k: hits / count for k, (hits, count) in grid_counts(records).items()}
    return sorted({k[0] for k in cells}), sorted({k[1] for k in cells}), cells


def grid_counts(records: list[dict]) -> dict[tuple[int, float], tuple[float, int]]:
    """{(length, depth): (keys retrieved, keys asked)} over every seed."""
    return _pooled(records, lambda r: (int(r["eval_length"]), float(r["depth"])))


def _with_interval(value: float, interval: tuple[float, float]) -> str:
    return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


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
            pooled = several_seeds(recs) > 1
            ax.plot(list(points), list(points.values()), ms=4, **plots.style(i, run),
                    label=_series_label(label, key, groups) + (": band, 95% Wilson interval" if pooled else ""))
            if pooled:
                bands = interval_by_length(recs)
                ax.fill_between(list(bands), [lo for lo, _ in bands.values()], [hi for _, hi in bands.values()],
                                color=plots.style(i)["color"], alpha=0.15, lw=0)
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


def same_as_shorter(records: list[dict]) -> set[tuple[int, float]]:
    """The (length, depth) cells whose 95% Wilson interval (every key of every seed) holds the value of
    the same depth at the next shorter length: no difference from it is shown."""
    counts = grid_counts(records)
    lengths = sorted({length for length, _ in counts})
    marked = set()
    for (length, depth), (hits, count) in counts.items():
        i = lengths.index(length)
        shorter = counts.get((lengths[i - 1], depth)) if i else None
        if shorter:
            low, high = wilson(hits, count)
            if low <= shorter[0] / shorter[1] <= high:
                marked.add((length, depth))
    return marked


def heatmap_figure(label: str, records: list[dict]):
    """Accuracy of each (depth, length) cell, values written in the cells (records of one series;
    cells that several records share show their count-weighted mean). Records of several seeds: a
    cell whose interval holds the next shorter length's value is marked (`same_as_shorter`), and the
    title says so."""
    lengths, depths, cells = grid(records)
    seeds = several_seeds(records)
    marked = same_as_shorter(records) if seeds > 1 else set()
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
                mark = SAME_AS_SHORTER if (lengths[x], depths[y]) in marked else ""
                ax.text(x, y, f"{values[y, x]:.2f}{mark}", ha="center", va="center", fontsize=8,
                        color="black" if 0.25 < values[y, x] < 0.85 else "white")
    ax.set_xticks(range(len(lengths)), [str(l) for l in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("key depth\n(0 = start, 1 = just before the question)", fontsize=9)
    train = sorted({int(r["train_length"]) for r in records if "train_length" in r})
    note = (f"; {SAME_AS_SHORTER}: its 95% Wilson interval (every key of the {seeds} seeds) holds the value at the "
            f"next shorter length" if seeds > 1 else "")
    ax.set_title(plots.wrap(f"Passkey accuracy: {label}" + (f" (trained at L={', '.join(map(str, train))})"
                                                            if train else "") + note, int(width * 11)), fontsize=9)
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
    cells = [_length_cells(recs) for _, recs in columns]
    lines = ["### Passkey accuracy (exact match, mean over depths)", "",
             "| length | " + " | ".join(label for label, _ in columns) + " |", "|" + "---:|" * (len(columns) + 1)]
    for length in lengths:
        lines.append(f"| {length} | " + " | ".join(c.get(length, "") for c in cells) + " |")
    counts = sorted({int(r["count"]) for _, recs in columns for r in recs})
    digits = sorted({int(r.get("digits", 4)) for _, recs in columns for r in recs})
    lines += ["", f"Examples per (length, depth) cell: {', '.join(map(str, counts))}"
                  + (" per seed" if any(several_seeds(recs) > 1 for _, recs in columns) else "") + "; "
                  f"chance (guessing a {'/'.join(map(str, digits))}-digit number): "
                  f"{', '.join(f'{10.0 ** -d:.0e}' for d in digits)}."]
    if any(several_seeds(recs) > 1 for _, recs in columns):
        lines.append("A run of several seeds: accuracy over every key of every seed (the same keys for each seed), "
                     "[low, high] its 95% Wilson interval over those keys.")
    if any(generated(recs) for _, recs in columns):
        lines.append("generated: an instruction before the text, the key sentence inside it, a question at the end; "
                     "the answer generated greedily with the key / value cache, correct where its first number is "
                     "the key; [low, high]: the 95% Wilson interval over the keys asked (a length's: over every "
                     "depth); 'generated, chat': that prompt in the model's chat template. The others: the compact "
                     "form, its digits teacher forced.")
    lines.append("")
    for label, recs in columns:
        lens, depths, values = grid(recs)
        counts_of = grid_counts(recs) if several_seeds(recs) > 1 or generated(recs) else {}
        steps = sorted({int(r["step"]) for r in recs if "step" in r})
        lines += [f"### {label}: accuracy by length and depth" + (f" (step {', '.join(map(str, steps))})" if steps else ""),
                  "", "| depth | " + " | ".join(map(str, lens)) + " |", "|" + "---:|" * (len(lens) + 1)]
        for depth in depths:
            lines.append(f"| {depth:g} | " + " | ".join(
                "" if (l, depth) not in values else _with_interval(values[(l, depth)], wilson(*counts_of[(l, depth)]))
                if counts_of else f"{values[(l, depth)]:.2f}" for l in lens) + " |")
        lines.append("")
    return "\n".join(lines)


def _length_cells(records: list[dict]) -> dict[int, str]:
    """{length: the accuracy over every depth as a table shows it}: with its interval for several seeds."""
    means = mean_by_length(records)
    if several_seeds(records) > 1 or generated(records):
        intervals = interval_by_length(records)
        return {length: _with_interval(value, intervals[length]) for length, value in means.items()}
    return {length: f"{value:.2f}" for length, value in means.items()}


def run_label(run: dict) -> str:
    """'alibi (L=64, passkey 0.5)' from experiment/report/runs.py's description of a run; ', 3 seeds'
    for a run of several (experiment/report/seeds.py), ', seed N' for one of them given alone."""
    fraction = run["passkey_fraction"]
    seeds = f", {len(run['members'])} seeds" if "members" in run else \
        f", seed {run['seed']}" if "group_label" in run else ""
    return f"{run['scheme']} (L={run['train_length']}" + (f", passkey {fraction:g})" if fraction else ")") + seeds


def seed_records(run: dict) -> list[dict]:
    """The passkey records of a run; of a run of several seeds, every seed's, each with its `train_seed`."""
    if "members" not in run:
        return run["run"].records("passkey")
    return [{**r, "train_seed": member["seed"]} for member in members(run) for r in member["run"].records("passkey")]


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
        records = seed_records(run)
        if not records:
            missing.append(str(run["workdir"]))
        runs.append({"label": run_label(run), "name": run["name"], "file": run["file"], "records": records})
    if missing:
        raise FileNotFoundError(f"no eval/passkey.json in {', '.join(missing)}; evaluate passkey retrieval there "
                                f"first (python eval_extrapolate.py --workdir DIR --passkey)")
    distinguish(runs)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    designed = [(run["label"], [r for r in run["records"] if r.get("placement") == "designed"]) for run in runs]
    for run in runs:  # keys placed by distance: their own table, never pooled with the depths
        run["records"] = [r for r in run["records"] if r.get("placement") != "designed"]
    runs = [run for run in runs if run["records"]]
    by_distance = distance_table(designed)
    if not runs:
        files.write_atomically(out / "passkey.md", "# Passkey retrieval\n\n" + by_distance)
        return {"md": str(out / "passkey.md"), "heatmaps": []}
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
    files.write_atomically(out / "passkey.md", "# Passkey retrieval vs. evaluation length\n\n"
                           + passkey_table([(run["label"], run["records"]) for run in runs])
                           + ("\n\n" + by_distance if by_distance else ""))
    return {"png": str(out / "passkey_vs_length.png"), "md": str(out / "passkey.md"), "heatmaps": heatmaps}


def distance_table(runs: list[tuple[str, list[dict]]]) -> str:
    """Keys placed by distance from the prompt's end (--passkey_distances): found / asked with a 95%
    Wilson interval, by run and method, length and distance ('' where there are none)."""
    rows = []
    for label, records in runs:
        for r in sorted(records, key=lambda r: (curve_options(r), passkey_form(r), r["eval_length"],
                                                min(r.get("distances") or [0]))):
            found = round(r["accuracy"] * r["count"])
            low, high = wilson(found, r["count"])
            method = json.loads(curve_options(r)).get("method", "as trained")
            back = r.get("distances") or []
            rows.append(f"| {label} | {method} | {passkey_form(r)} | {r['eval_length']:,} | {r['distance']} "
                        f"({min(back):,}-{max(back):,}) | {found}/{r['count']} [{100 * low:.0f}, {100 * high:.0f}] |")
    if not rows:
        return ""
    return ("## Keys placed by distance from the prompt's end\n\nEach key sentence this many tokens before the "
            "prompt's end (--passkey_distances; never pooled with the depths above); found of asked, 95% Wilson "
            "interval.\n\n| run | method | form | length | distance (tokens back) | found |\n"
            "|---|---|---|---:|---|---:|\n" + "\n".join(rows) + "\n")


def report(runs: list[dict], out: str | pathlib.Path) -> dict:
    """The passkey part of a report (experiment/report/__init__.py), for the runs that have passkey
    records (a run of several seeds: where any seed has): {"passkey": `write`'s paths}, or nothing
    when none has."""
    with_passkey = [run for run in runs if any(m["run"].records_path("passkey").exists() for m in members(run))]
    return {"passkey": write(with_passkey, out)} if with_passkey else {}
