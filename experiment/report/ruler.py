"""RULER tables and figures (records of experiment/evals/ruler.py): each task's score by length and
method with its 95% Wilson interval and sample count, the average over the tasks every column has,
the effective length of each method (over the averaged tasks, and over each task alone that ran at
more than one length), a task x length heat map per method and the average against length.

A column is one evaluation of a run: its method (or eval-time options), template and checkpoint.
A cell's interval treats its examples' scores (each the fraction of references found, 0 or 1 for a
task of one reference) as a proportion: the Wilson interval of their sum over their count; an
average pools the examples of every averaged task the same way.

Effective length (RULER's): the longest length up to which every evaluated length's average is at
least the threshold: RULER's 85.6 (Llama-2-7B's average at 4k), and, since a small model starts far
below it, the model's own: the lower end of the 95% interval of its average at the shortest length
as trained (the column without a method or options, or `direct`), i.e. the longest length not shown
to be worse than the model is within its window. A length the report has (another column ran it)
that a column lacks below its longest ends that column's count: a length not run is not passed.
"""
from __future__ import annotations

import json
import pathlib
from collections import defaultdict

import numpy as np

from experiment.report import distances, pairs, plots
from experiment.report.runs import describe, distinguish, file_stems, name_runs
from experiment.report.seeds import members, wilson
from experiment.store import files
from experiment.store.records import curve_options

RULER_THRESHOLD = 0.856  # Hsieh et al. 2024: Llama-2-7B's average over RULER's 13 tasks at 4k


def column_name(record: dict) -> str:
    """How a column is headed: the method, else the eval-time options ('self_extend_group=16, ...'),
    else 'as trained'; ', chat' for the chat template."""
    options = json.loads(curve_options(record))
    name = options.get("method") or ", ".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(options.items()))
    return (name or "as trained") + (", chat" if record.get("template", "base") == "chat" else "")


def columns(runs: list[tuple[str, list[dict]]]) -> dict[str, list[dict]]:
    """{column label: its records}, in the order first seen; the run's label in front where there
    are several runs, the checkpoint's step where a run holds records of several."""
    out: dict[str, list[dict]] = defaultdict(list)
    for label, records in runs:
        steps = {r.get("step") for r in records}
        for r in records:
            name = column_name(r) + (f", step {r.get('step')}" if len(steps) > 1 else "")
            out[f"{label}: {name}" if len(runs) > 1 else name].append(r)
    return dict(out)


def cells(records: list[dict]) -> dict[tuple[str, int], tuple[float, int]]:
    """{(task, length): (sum of the examples' scores, examples)}."""
    return {(r["task"], int(r["eval_length"])): (r["score"] * r["count"], int(r["count"])) for r in records}


def averaged_tasks(by_column: dict[str, list[dict]]) -> list[str]:
    """The tasks that every column has at every length it has: the ones an average is taken over."""
    common = None
    for records in by_column.values():
        got = cells(records)
        lengths = {n for _, n in got}
        tasks = {t for t, _ in got}
        full = {t for t in tasks if all((t, n) in got for n in lengths)}
        common = full if common is None else common & full
    order = [r["task"] for records in by_column.values() for r in records]
    return [t for t in dict.fromkeys(order) if t in (common or set())]


def average(records: list[dict], tasks: list[str]) -> dict[int, tuple[float, tuple[float, float], int]]:
    """{length: (mean over `tasks` of their scores, the Wilson interval over their examples, examples)}."""
    got = cells(records)
    out = {}
    for n in sorted({n for _, n in got}):
        if tasks and all((t, n) in got for t in tasks):
            hits = sum(got[(t, n)][0] for t in tasks)
            count = sum(got[(t, n)][1] for t in tasks)
            out[n] = (float(np.mean([got[(t, n)][0] / got[(t, n)][1] for t in tasks])), wilson(hits, count), count)
    return out


def effective_length(means: dict[int, float], threshold: float, lengths=()) -> int | None:
    """The longest length up to which every length's mean is >= threshold (None: not even the shortest).
    `lengths`: every length the report has; one of them that `means` lacks below its longest ends the
    count there (a length not run is not passed), as gap() says."""
    best = None
    for n in sorted(set(means) | {n for n in lengths if n < max(means, default=0)}):
        if n not in means or means[n] < threshold:
            break
        best = n
    return best


def gap(means: dict[int, float], lengths) -> int | None:
    """The shortest of `lengths` below the longest in `means` that `means` lacks (None: none)."""
    missing = [n for n in sorted(lengths) if n not in means and n < max(means, default=0)]
    return missing[0] if missing else None


def own_threshold(by_column: dict[str, list[dict]], tasks: list[str]) -> tuple[float, str] | None:
    """(the lower end of the 95% interval of the model's average at its shortest length as trained,
    which column gave it), from the first column without a method or options (or `direct`)."""
    for label, records in by_column.items():
        if json.loads(curve_options(records[0])) in ({}, {"method": "direct"}):
            avg = average(records, tasks)
            if avg:
                n = min(avg)
                return avg[n][1][0], f"{label} at {n:,}"
    return None


def _cell(value: float, interval: tuple[float, float]) -> str:
    return f"{100 * value:.1f} [{100 * interval[0]:.0f}, {100 * interval[1]:.0f}]"


def _length_text(n: int | None, shortest: int) -> str:
    return f"< {shortest:,}" if n is None else f"{n:,}"


def _effective_text(means: dict[int, float], threshold: float, lengths: list[int]) -> str:
    """The effective length as the table shows it: `*` where the count stopped at a length the column
    did not run, `+` where it reached the column's longest length and the report has longer ones."""
    n = effective_length(means, threshold, lengths)
    following = [k for k in lengths if n is None or k > n]
    if following and following[0] == gap(means, lengths):
        return _length_text(n, lengths[0]) + " *"
    return _length_text(n, lengths[0]) + (" +" if n is not None and n == max(means) < lengths[-1] else "")


def tables(by_column: dict[str, list[dict]], book_tasks: set[str]) -> str:
    """Markdown: the average by length and column, the effective lengths, then each task's score by
    length and column (scores in percent, [low, high] the 95% Wilson interval), with its own
    effective lengths where it ran at more than one length."""
    tasks = averaged_tasks(by_column)
    lengths = sorted({int(r["eval_length"]) for recs in by_column.values() for r in recs})
    names = list(by_column)
    averages = {c: average(recs, tasks) for c, recs in by_column.items()}
    counts = sorted({int(r["count"]) for recs in by_column.values() for r in recs})
    marked = [f"{t} (book haystack)" if t in book_tasks else t for t in tasks]
    lines = ["### Average score (percent) over the tasks " + ", ".join(marked), "",
             "| length | " + " | ".join(names) + " |", "|" + "---:|" * (len(names) + 1)]
    for n in lengths:
        lines.append(f"| {n:,} | " + " | ".join(_cell(averages[c][n][0], averages[c][n][1]) if n in averages[c] else ""
                                                for c in names) + " |")
    lines += ["", f"Examples per (task, length): {', '.join(map(str, counts))}; [low, high]: the 95% Wilson interval "
                  f"over every example of the averaged tasks (a cell's: over its examples).", ""]
    lines += _effective_lines(by_column, tasks, lengths, "### Effective length")
    all_tasks = list(dict.fromkeys(r["task"] for recs in by_column.values() for r in recs))
    for task in all_tasks:
        label = f"{task} (book haystack)" if task in book_tasks else task
        lines += [f"### {label}: score (percent)", "", "| length | " + " | ".join(names) + " |",
                  "|" + "---:|" * (len(names) + 1)]
        got = {c: cells(recs) for c, recs in by_column.items()}
        for n in lengths:
            row = []
            for c in names:
                hits, count = got[c].get((task, n), (None, 0))
                row.append("" if hits is None else _cell(hits / count, wilson(hits, count)) + f" (n={count})")
            lines.append(f"| {n:,} | " + " | ".join(row) + " |")
        lines.append("")
        lines += _pairs_lines(by_column, task, lengths)
        task_lengths = sorted({n for (t, n) in set().union(*got.values()) if t == task})
        if len(task_lengths) > 1 and tasks != [task]:  # the average's table is this task's already
            lines += _effective_lines(by_column, [task], task_lengths, f"#### {label}: effective length")
    return "\n".join(lines)


def _pairs_lines(by_column: dict[str, list[dict]], task: str, lengths: list[int]) -> list[str]:
    """Per length, every pair of columns that answered the same examples of `task` (the same count and
    seed: example i is the same prompt), compared question by question (experiment/report/pairs.py)."""
    out = []
    for n in lengths:
        cells = {c: r for c, recs in by_column.items() for r in recs if r["task"] == task and int(r["eval_length"]) == n}
        same = {}
        for c, r in cells.items():
            if len(r.get("scores") or []) != int(r["count"]):
                continue
            same.setdefault((int(r["count"]), r.get("seed"), r.get("template", "base")), {})[c] = r["scores"]
        for (count, _, _), columns in same.items():
            if len(columns) > 1:
                binary = all(set(s) <= {0, 1} for s in columns.values())
                test = "exact McNemar" if binary else "partial scores: the sign test over the prompts"
                out += [f"{task} at {n:,}: pairs on the same {count} prompts ({test}; separated at 95%)", "",
                        pairs.pairs_table(columns)]
    return out


def _effective_lines(by_column: dict[str, list[dict]], tasks: list[str], lengths: list[int], heading: str) -> list[str]:
    """Markdown: each column's effective length over `tasks` (their average) at RULER's threshold and
    at the model's own, counted over `lengths`."""
    averages = {c: average(recs, tasks) for c, recs in by_column.items()}
    own = own_threshold(by_column, tasks)
    lines = [heading, "", "| column | RULER threshold 85.6 | the model's own "
             + (f"({100 * own[0]:.1f}: the 95% lower bound of {own[1]})" if own else "(no column as trained)") + " |",
             "|---|---:|---:|"]
    gaps = []
    for c, by_length in averages.items():
        means = {n: v[0] for n, v in by_length.items()}
        if gap(means, lengths) is not None:
            gaps.append(f"{c} has no {gap(means, lengths):,}")
        own_text = _effective_text(means, own[0], lengths) if own and means else ""
        lines.append(f"| {c} | {_effective_text(means, RULER_THRESHOLD, lengths) if means else ''} | {own_text} |")
    if gaps:
        lines += ["", "A length a column did not run ends its effective length there (" + "; ".join(gaps)
                  + "); * marks a count that stopped at such a length, not at a score below the threshold."]
    if any(max(averages[c], default=lengths[-1]) < lengths[-1] for c in averages):
        lines += ["", "+ marks the longest length a column ran: the longer ones were not run, not failed."]
    return lines + [""]


def heatmap_figure(label: str, records: list[dict], book_tasks: set[str]):
    """Score of each (task, length) of one column, values written in the cells."""
    got = cells(records)
    tasks = list(dict.fromkeys(r["task"] for r in records))
    lengths = sorted({n for _, n in got})
    values = np.full((len(tasks), len(lengths)), np.nan)
    for (task, n), (hits, count) in got.items():
        values[tasks.index(task), lengths.index(n)] = hits / count
    width = 3.6 + 0.9 * max(1, len(lengths))
    fig = plots.figure((width, 1.4 + 0.42 * max(1, len(tasks))))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for y in range(len(tasks)):
        for x in range(len(lengths)):
            if not np.isnan(values[y, x]):
                ax.text(x, y, f"{100 * values[y, x]:.0f}", ha="center", va="center", fontsize=8,
                        color="black" if 0.25 < values[y, x] < 0.85 else "white")
    ax.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths])
    ax.set_yticks(range(len(tasks)), [f"{t} (book)" if t in book_tasks else t for t in tasks], fontsize=8)
    ax.set_xlabel("length (tokens: prompt and answer budget)")
    counts = sorted({int(r["count"]) for r in records})
    train = sorted({int(r["train_length"]) for r in records if "train_length" in r})
    ax.set_title(plots.wrap(f"RULER score (percent): {label}" + (f"; window {', '.join(map(str, train))}" if train else "")
                            + f"; {'/'.join(map(str, counts))} examples a cell", int(width * 11)), fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.05)
    return fig


def average_figure(by_column: dict[str, list[dict]], tasks: list[str]):
    """The average over `tasks` against length, one line per column, its 95% interval a band."""
    fig = plots.figure((9, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    train = set()
    for i, (label, records) in enumerate(by_column.items()):
        avg = average(records, tasks)
        if not avg:
            continue
        xs = list(avg)
        ax.plot(xs, [100 * v[0] for v in avg.values()], ms=4, label=label, **plots.style(i))
        ax.fill_between(xs, [100 * v[1][0] for v in avg.values()], [100 * v[1][1] for v in avg.values()],
                        color=plots.style(i)["color"], alpha=0.12, lw=0)
        train |= {int(r["train_length"]) for r in records if "train_length" in r}
    plots.mark_train_lengths(ax, train)
    ax.axhline(100 * RULER_THRESHOLD, color="black", ls=":", lw=0.8, label="RULER's threshold (85.6)")
    plots.format_length_axis(ax)
    ax.set_ylim(-3, 103)
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("RULER score, average (percent)")
    ax.set_title(plots.wrap("RULER average over " + ", ".join(tasks) + " (band: 95% Wilson interval)", 100), fontsize=9)
    plots.legend_beside(ax)
    return fig


def write(workdirs: list, out: str | pathlib.Path) -> dict:
    """OUT/ruler.md, OUT/ruler_average.png and OUT/ruler_heatmap_<column>.png from the runs'
    eval/ruler.json (workdirs, or runs described by experiment/report/runs.py); a run without RULER
    records is refused by name."""
    described = [w if isinstance(w, dict) else describe(w) for w in workdirs]
    if not all("name" in run for run in described):
        name_runs(described)
    missing = [str(run["workdir"]) for run in described if not run["run"].records("ruler")]
    if missing:
        raise FileNotFoundError(f"no eval/ruler.json in {', '.join(missing)}; score RULER there first "
                                f"(python eval_extrapolate.py --workdir DIR --ruler)")
    runs = [{"label": run.get("label") or run["name"], "records": run["run"].records("ruler")} for run in described]
    distinguish(runs)
    every = columns([(run["label"], run["records"]) for run in runs])
    by_column = {c: kept for c, recs in every.items() if (kept := [r for r in recs if not distances.is_designed(r)])}
    book = {r["task"] for recs in by_column.values() for r in recs if r.get("haystack") == "book"}
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    heatmaps, text = [], "# RULER by task, length and method\n\n"
    if by_column:  # RULER's own placements
        tasks = averaged_tasks(by_column)
        plots.save(average_figure(by_column, tasks), out / "ruler_average.png")
        for stem, (label, records) in zip(file_stems(list(by_column)), by_column.items()):
            path = out / f"ruler_heatmap_{stem}.png"
            plots.save(heatmap_figure(label, records, book), path)
            heatmaps.append(str(path))
        text += tables(by_column, book)
    designed = distances.tables(every)
    files.write_atomically(out / "ruler.md", text + ("\n\n" + designed if designed else ""))
    return {"md": str(out / "ruler.md"), "png": str(out / "ruler_average.png") if by_column else None,
            "heatmaps": heatmaps}


def report(runs: list[dict], out: str | pathlib.Path) -> dict:
    """The RULER part of a report (experiment/report/__init__.py), for the runs that have RULER
    records: {"ruler": `write`'s paths}, or nothing when none has."""
    with_ruler = [run for run in runs if any(m["run"].records_path("ruler").exists() for m in members(run))]
    return {"ruler": write(with_ruler, out)} if with_ruler else {}


def compare(committed: list[dict], new: list[dict], tolerance: float = 0.0) -> tuple[str, bool]:
    """(a summary, whether every cell of `new` is within `tolerance` of the committed one): the cells
    of `new` (task, length, column) matched with the committed records' (study.py configs/studies/NAME.py --check)."""
    def key_of(r):
        return (column_name(r), r["task"], int(r["eval_length"])) + distances.cell_key(r)[4:]
    old = {key_of(r): r for r in committed}
    worst, missing, lines = 0.0, [], []
    for r in new:
        key = key_of(r)
        if key not in old:
            missing.append(key)
            continue
        diff = abs(r["score"] - old[key]["score"])
        worst = max(worst, diff)
        lines.append(f"{key[0]} {key[1]} L={key[2]}: {100 * r['score']:.1f} (committed {100 * old[key]['score']:.1f}, "
                     f"{r['count']} / {old[key]['count']} examples)")
    same = not missing and bool(lines) and worst <= tolerance
    summary = "\n".join(lines + [f"not in the committed records: {missing}" if missing else "",
                                 f"largest difference: {100 * worst:.1f} points (tolerance {100 * tolerance:.1f})"])
    return summary.strip(), same


def main(argv: list[str]) -> int:
    """python -m experiment.report.ruler RUN [RUN ...] --out DIR [--compare_with RECORDS.json
    [--tolerance T]]: the RULER report of runs that have only RULER records (report.py starts from
    perplexity records and refuses those), and the check of a re-run against committed records."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(prog="python -m experiment.report.ruler")
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare_with", help="committed records (results/NAME/records/ruler.json)")
    parser.add_argument("--tolerance", type=float, default=0.0, help="--compare_with: the largest difference allowed")
    args = parser.parse_args(argv)
    try:
        paths = write(args.runs, args.out)
        print(f"wrote {paths['md']}, {paths['png'] or 'no average figure'} and {len(paths['heatmaps'])} heat maps")
        if args.compare_with:
            committed = json.loads(pathlib.Path(args.compare_with).read_text())
            new = [r for run in args.runs for r in describe(run)["run"].records("ruler")]
            text, same = compare(committed, new, args.tolerance)
            print(text)
            if not same:
                print(f"error: the re-run differs from {args.compare_with}", file=sys.stderr)
                return 1
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
