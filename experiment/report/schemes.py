"""The table of every scheme (issue #23, results/all_schemes/): one row per scheme or option, with its
family and citation, perplexity at L, perplexity ratio to L and passkey accuracy at each evaluation
length, sorted by perplexity at the longest length; a heat map of the same numbers; and the numbers
as JSON.

Input: a table root as experiment/pipeline/table.py leaves it: ROOT/rows.json (the manifest: the
protocol, and per row its run folder, family, citation, the eval-time overrides it takes at each
length and why a length cannot be evaluated) and the runs' records (eval/extrapolation.json,
eval/passkey.json). A row reads, at each length, only the records with exactly its overrides, so the
rope run's extensions (each with its own factor per length) are rows of their own (read in
schemes_rows.py: the manifest, each row's numbers, ranks, kept rows; here the table, the heat map and
the writing). Nothing here scores.

A row's run trained with other seeds too (sweep.py --table --seeds: RUN_seed<N> beside RUN) reads
every seed's records: perplexity the mean, shown as mean ± std (n); passkey accuracy over every key of
every seed, with its 95% Wilson interval; and rows whose perplexity intervals (mean ± std) at the
longest length overlap share a rank (shown 3=). A table of one seed per row is as it was.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
from matplotlib.colors import LogNorm, Normalize

from experiment.report import plots
from experiment.report.schemes_rows import (MANIFEST, NOT_YET, TIMINGS, collect, rank_with_ties, read_kept,
                                            read_manifest, read_timings, seed_runs)
from experiment.store import files, output

__all__ = ["MANIFEST", "NOT_YET", "TIMINGS", "collect", "rank_with_ties", "read_kept", "read_manifest",
           "read_timings", "seed_runs", "table", "figure", "as_json", "write"]

# --- the table -----------------------------------------------------------------------------------

def _length_name(length: int, train_length: int) -> str:
    multiple = length / train_length
    return f"{length} ({multiple:g}L)" if multiple != 1 else f"{length} (L)"


def table(collected: dict, timings: dict | None = None) -> str:
    """Markdown: the protocol, one row per scheme or option (rank, family, citation, perplexity at L
    and at the longest length, ratio to L at each longer length, passkey accuracy at each length),
    the cells that cannot exist with a numbered note saying why, and the rules of the options."""
    protocol, rows = collected["protocol"], collected["rows"]
    lengths, L = protocol["lengths"], protocol["train_length"]
    notes: dict[str, tuple[int, str]] = {}  # row name -> (note number, why: its shortest length's reason)

    def cell(value, row, length, fmt):
        if isinstance(value, str):  # a value with its spread, written already
            return value
        if value is not None:
            return fmt.format(value)
        if row["missing"][length] == NOT_YET:
            return "–"
        why = next(w for n in lengths if (w := row["missing"][n]) != NOT_YET and (n not in row["ppl"] or
                                                                                  n not in row["passkey"]))
        return f"n/a [{notes.setdefault(row['name'], (len(notes) + 1, why))[0]}]"

    header = (["#", "scheme", "family", "citation", f"ppl {lengths[0]}", f"ppl {lengths[-1]}"]
              + [f"ratio {_length_name(n, L)}" for n in lengths[1:]]
              + [f"passkey {_length_name(n, L)}" for n in lengths])
    def ppl(row, length):
        s = row.get("ppl_spread", {}).get(length)
        return f"{s['mean']:.2f} ± {s['std']:.2f} ({s['n']})" if s else row["ppl"].get(length)

    def passkey(row, length):
        interval = row.get("passkey_interval", {}).get(length)
        value = row["passkey"].get(length)
        return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else value

    lines = ["| " + " | ".join(header) + " |", "|---:|---|---|---|" + "---:|" * (len(header) - 4)]
    for row in rows:
        rank = f"{row['rank']}=" if row.get("tied") else str(row["rank"])
        cells = [rank, row["name"], row["family"], row["citation"],
                 cell(ppl(row, lengths[0]), row, lengths[0], "{:.2f}"),
                 cell(ppl(row, lengths[-1]), row, lengths[-1], "{:.2f}")]
        cells += [cell(row["ratio"].get(n), row, n, "{:.2f}") for n in lengths[1:]]
        cells += [cell(passkey(row, n), row, n, "{:.2f}") for n in lengths]
        lines.append("| " + " | ".join(cells) + " |")
    out = [f"# Every scheme: perplexity and passkey retrieval from L to {lengths[-1] // L}L", "",
           protocol.get("description", ""), "",
           f"Sorted by perplexity at {lengths[-1]} ({lengths[-1] // L}L). `ratio`: perplexity at that length "
           f"over the row's own perplexity at L = {L}. `passkey`: exact-match accuracy, mean over depths "
           f"{', '.join(f'{d:g}' for d in protocol['passkey']['depths'])} ({protocol['passkey']['per_cell']} keys "
           f"each; chance {10.0 ** -protocol['passkey']['digits']:.0e}). –: not evaluated (yet).", "",
           *seeds_note(rows, lengths[-1]), *kept_note(collected), *lines, ""]
    if notes:
        out += ["Cells that cannot exist:", ""] + [f"[{n}] {name}: {why}" for name, (n, why) in notes.items()] + [""]
    rules = [row for row in rows if row.get("rule")]
    if rules:
        out += ["Options of the rows (training runs' settings, or eval-time settings per length), and where a row's "
                "form departs from its paper:", ""]
        out += [f"- {row['name']}: {row['rule']}" for row in sorted(rules, key=lambda r: r["name"])] + [""]
    if timings:
        out += timings_table(timings)
    return "\n".join(out)


def kept_note(collected: dict) -> list[str]:
    """A line naming the rows taken from an earlier table (`keep`) and the rows measured this time."""
    kept = [row["name"] for row in collected["rows"] if row.get("kept")]
    if not kept:
        return []
    fresh = [row["name"] for row in collected["rows"] if not row.get("kept")]
    return [f"{len(kept)} rows are those of an earlier table measured under the same protocol "
            f"({collected['kept_from']}); measured again this time: {', '.join(fresh) or 'none'}.", ""]


def seeds_note(rows: list[dict], last: int) -> list[str]:
    """What the cells of rows with several seeds mean (nothing where every row has one seed)."""
    several = [row for row in rows if len(row.get("seed_runs", [])) > 1]
    if not several:
        return []
    return [f"Rows trained with several seeds ({', '.join(row['name'] for row in several)}; folders RUN_seed<N> beside "
            f"RUN): perplexity as mean ± std (n seeds, std the sample standard deviation), the ratio of the means; "
            f"passkey accuracy over every key of every seed with [low, high] its 95% Wilson interval. Rows share a "
            f"rank (shown 3=) where one has several seeds and their intervals at {last}, mean ± std (a row of one "
            f"seed: its value), overlap.", ""]


def timings_table(timings: dict) -> list[str]:
    """Markdown lines: per training run, wall and CPU seconds of training and of its evaluations."""
    def minutes(seconds):
        return f"{seconds / 60:.1f}" if seconds else "–"
    lines = ["Time per run (minutes; CPU = process CPU time, all threads; summed over resumptions):", "",
             "| run | train wall | train CPU | eval wall | eval CPU |", "|---|---:|---:|---:|---:|"]
    for name, t in sorted(timings.items()):
        lines.append(f"| {name} | {minutes(t.get('train_wall_s'))} | {minutes(t.get('train_cpu_s'))} | "
                     f"{minutes(t.get('eval_wall_s'))} | {minutes(t.get('eval_cpu_s'))} |")
    totals = {k: sum(t.get(k, 0.0) for t in timings.values()) for k in
              ("train_wall_s", "train_cpu_s", "eval_wall_s", "eval_cpu_s")}
    lines.append(f"| **all** | {minutes(totals['train_wall_s'])} | {minutes(totals['train_cpu_s'])} | "
                 f"{minutes(totals['eval_wall_s'])} | {minutes(totals['eval_cpu_s'])} |")
    return lines + [""]


# --- the heat map -------------------------------------------------------------------------------

def _text_color(cmap, norm, value) -> str:
    r, g, b, _ = cmap(norm(value))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _panel(ax, values: np.ndarray, cmap, norm, reasons: list[list[str]], fmt: str, columns: list[str]):
    """One heat map: values written in their cells; a missing cell is gray with 'n/a' (cannot) or '–'."""
    ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    ax.set_facecolor("#dddddd")
    for y in range(values.shape[0]):
        for x in range(values.shape[1]):
            v = values[y, x]
            if np.isnan(v):
                ax.text(x, y, "–" if reasons[y][x] == NOT_YET else "n/a", ha="center", va="center",
                        fontsize=7, color="#555555")
            else:
                ax.text(x, y, fmt.format(v), ha="center", va="center", fontsize=7,
                        color=_text_color(cmap, norm, v))
    ax.set_xticks(range(len(columns)), columns, fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(axis="x", length=0)
    ax.set_xticks(np.arange(-0.5, len(columns)), minor=True)
    ax.set_yticks(np.arange(-0.5, values.shape[0]), minor=True)
    ax.grid(which="minor", color="white", lw=0.8)
    ax.tick_params(which="minor", length=0)


def figure(collected: dict):
    """Three heat maps sharing the rows (the table's order): perplexity at L, the ratio to L at each
    longer length (log colour scale, green = no worse than at L), and passkey accuracy at each length."""
    import matplotlib
    protocol, rows = collected["protocol"], collected["rows"]
    lengths, L = protocol["lengths"], protocol["train_length"]
    n = max(1, len(rows))
    first = np.array([[r["ppl"].get(lengths[0], np.nan)] for r in rows] or [[np.nan]])
    ratio = np.array([[r["ratio"].get(x, np.nan) for x in lengths[1:]] for r in rows] or [[np.nan] * (len(lengths) - 1)])
    passkey = np.array([[r["passkey"].get(x, np.nan) for x in lengths] for r in rows] or [[np.nan] * len(lengths)])
    reasons = [[r["missing"][x] for x in lengths] for r in rows] or [[NOT_YET] * len(lengths)]

    fig = plots.figure((13, 1.9 + 0.24 * n))
    grid = fig.add_gridspec(1, 3, width_ratios=[1.1, len(lengths) - 1, len(lengths)], wspace=0.05)
    axes = [fig.add_subplot(grid[0, i]) for i in range(3)]
    finite = first[np.isfinite(first)]
    ppl_norm = LogNorm(vmin=max(1.0, finite.min()) if finite.size else 1.0,
                       vmax=max(finite.max(), finite.min() * 1.01) if finite.size else 10.0)
    worst = np.nanmax(ratio) if np.isfinite(ratio).any() else 2.0
    ratio_norm = LogNorm(vmin=1 / 1.5, vmax=max(2.0, worst))
    cmaps = [matplotlib.colormaps["Blues"], matplotlib.colormaps["RdYlGn_r"], matplotlib.colormaps["RdYlGn"]]
    names = [f"{x}\n({x / L:g}L)" if x != L else f"{x}\n(L)" for x in lengths]
    _panel(axes[0], first, cmaps[0], ppl_norm, [[r[0]] for r in reasons], "{:.2f}", [names[0]])
    _panel(axes[1], ratio, cmaps[1], ratio_norm, [r[1:] for r in reasons], "{:.2f}", names[1:])
    _panel(axes[2], passkey, cmaps[2], Normalize(0.0, 1.0), reasons, "{:.2f}", names)
    labels = [f"{r['rank']}{'=' if r.get('tied') else ''}. {r['name']}  [{r['family']}]" for r in rows] or [""]
    axes[0].set_yticks(range(len(labels)), labels, fontsize=8)
    for ax in axes[1:]:
        ax.set_yticks(range(len(labels)), [""] * len(labels))
        ax.tick_params(axis="y", length=0)
    titles = [f"perplexity\nat L = {L}", "perplexity / perplexity at L\n(log colour; green: no worse than at L)",
              "passkey accuracy (exact match,\nmean over depths)"]
    for ax, text in zip(axes, titles):
        ax.set_xlabel(text, fontsize=9)
    fig.suptitle(f"Every scheme trained at L = {L}, evaluated at {', '.join(map(str, lengths))} "
                 f"(rows sorted by perplexity at {lengths[-1]})", fontsize=10)
    return fig


# --- writing -------------------------------------------------------------------------------------

def as_json(collected: dict, timings: dict | None = None) -> dict:
    """The numbers the table comes from, lengths as strings (JSON object keys)."""
    keep = ("rank", "name", "run", "scheme", "family", "citation", "rule", "overrides", "step")
    several = ("seed_runs", "ppl_spread", "passkey_interval")  # rows of several seeds only
    rows = [{**{k: row.get(k) for k in keep},
             **{field: {str(k): v for k, v in row[field].items()} for field in ("ppl", "ratio", "passkey")},
             **({"seed_runs": row["seed_runs"], **{field: {str(k): v for k, v in row[field].items()}
                                                   for field in several[1:]}} if "seed_runs" in row else {}),
             **({"tied": True} if row.get("tied") else {}), **({"kept": True} if row.get("kept") else {}),
             "missing": {str(k): why for k, why in row["missing"].items()
                         if k not in row["ppl"] or k not in row["passkey"]}}
            for row in collected["rows"]]
    return {"protocol": collected["protocol"], "rows": rows, "timings": timings or {},
            **({"kept_from": collected["kept_from"]} if "kept_from" in collected else {})}


def write(root: str | pathlib.Path, out: str | pathlib.Path, keep: str | pathlib.Path | None = None) -> dict:
    """OUT/all_schemes.md, OUT/all_schemes.png and OUT/all_schemes.json from the table root ROOT; with
    `keep` (an earlier table's all_schemes.json), rows whose runs are not under ROOT keep its numbers
    and times."""
    root, out = pathlib.Path(root), pathlib.Path(out)
    output.claim(out, "report.py")
    kept = read_kept(keep, read_manifest(root)["protocol"]) if keep else None
    collected = collect(root, kept)
    timings = read_timings(root)
    if kept:
        timings = {**{row["run"]: kept["timings"][row["run"]] for row in collected["rows"]
                      if row.get("kept") and row["run"] in kept["timings"]}, **timings}
    with output.replacing(out, "report.py") as staging:
        files.write_atomically(staging / "all_schemes.md", table(collected, timings))
        fig = figure(collected)
        plots.drawable_texts(fig)
        plots.write(fig, staging / "all_schemes.png", dpi=plots.DPI, bbox_inches="tight")  # long row labels kept whole
        files.write_atomically(staging / "all_schemes.json", json.dumps(as_json(collected, timings), indent=1))
    return {k: str(out / f"all_schemes.{k}") for k in ("md", "png", "json")}
