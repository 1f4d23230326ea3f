"""Perplexity-vs-length plots and tables from one or more run directories: one plot panel and separate
tables per unit of perplexity (byte, BPE token, word), and the published curves of Press et al. (2022)
beside ours only where dataset, split, unit and training length match theirs. A run of several seeds
(experiment/report/seeds.py: its records the means, with `ppl_spread`) is drawn as its mean with a
band from its lowest to its highest seed, and tabulated as mean ± std (n)."""
from __future__ import annotations

import json
import pathlib
from collections import defaultdict

from experiment.report import bands, paper, plots
from experiment.report.runs import describe, label_runs, title, unit_names
from experiment.store import files, records
from experiment.store.run import RunDir

PAPER_MODES = ("auto", "always", "never")


def load_runs(workdirs: list[str | pathlib.Path]) -> list[dict]:
    """The runs (experiment/report/runs.py: describe, label) with their perplexity `records`;
    a run without any is refused, naming the command that makes them."""
    runs = []
    for workdir in map(pathlib.Path, workdirs):
        run = RunDir(workdir)
        if not run.records_path("perplexity").exists():
            raise FileNotFoundError(f"{workdir} has no evaluation results; run "
                                    f"python eval_extrapolate.py --workdir {workdir} first")
        info = describe(run)
        recs = info["run"].records("perplexity")
        for r in recs:
            r.setdefault("tokenizer", info["tokenizer"])
        # two records of the same tokens are one (an earlier version recorded a max_tokens beyond the split)
        recs = list({(records.record_key(r), r.get("step")): r for r in recs}.values())
        runs.append({**info, "records": recs})
    return label_runs(runs)


def series(run: dict) -> dict[tuple, list[dict]]:
    """{(unit, records.series_key, step): the run's records of that curve, sorted by eval_length}.
    Records of two checkpoints (an evaluation that fell back past a damaged one) are two curves:
    a curve, like a table column, never joins checkpoints."""
    out = defaultdict(list)
    for r in run["records"]:
        out[(r["tokenizer"], records.series_key(r), r.get("step"))].append(r)
    return {k: sorted(v, key=lambda r: r["eval_length"]) for k, v in out.items()}


def checkpoint_note(points: list[dict]) -> str:
    """'step 1000', or '' where the records carry no step (one curve holds one checkpoint)."""
    steps = sorted({int(r["step"]) for r in points if "step" in r})
    return f"step {', '.join(map(str, steps))}" if steps else ""


def series_label(run: dict, key: tuple, step, steps: int) -> str:
    """The run's label, then what sets this curve apart from its others: the stride (nonoverlapping,
    the default, unnamed), the first N tokens, eval-time options, the split, the checkpoint where the
    run's records come from several."""
    kind = records.series_label(key).removeprefix("nonoverlapping").lstrip(", ")  # the default: not named
    return (run["label"] + (f", {kind}" if kind else "")
            + ("" if key[0] == "valid" else f", {key[0]}") + (f", step {step}" if steps > 1 else ""))


def paper_curve(run: dict, unit: str, key: tuple, mode: str) -> list[tuple[int, float]]:
    """The paper's curve for one series of a run (nonoverlapping, or its stride-1 sliding window for
    any stride); 'auto' only for word-level WikiText-103 validation runs, as the paper's."""
    split, kind = key[0], key[1]
    if mode == "never" or (mode == "auto" and not (run["wikitext103"] and split == "valid" and unit == "word")):
        return []
    return paper.curve(run["scheme"], run["train_length"], sliding=kind != "nonoverlapping")


def method_of(key: tuple) -> str | None:
    """The training-free method of a series (experiment/evals/methods.py: 'yarn', 'yarn+logn'), or None."""
    return json.loads(key[3]).get("method") if key[3].startswith('{"method"') else None


def _method_order(run: dict) -> dict[str, int]:
    """{method without +logn: its rank}: 'direct' (the model as trained) first, the others by name."""
    names = {r["method"].removesuffix("+logn") for r in run["records"] if r.get("method")}
    return {name: rank for rank, name in enumerate(sorted(names, key=lambda n: (n != "direct", n)))}


def _by_unit(runs: list[dict]) -> dict[str, list[tuple[int, dict, tuple, list[dict], str]]]:
    """{unit: [(run index, run, series key, points, label)]}, units and series in a stable order
    (unit, split, series label: nonoverlapping before strides, then the newest checkpoint first; a
    run's training-free methods 'direct' first, then by name, each before its log-n form)."""
    out = defaultdict(list)
    for i, run in enumerate(runs):
        curves, order = series(run), _method_order(run)

        def rank(item):
            (unit, key, step), _ = item
            method = method_of(key) or ""
            plain = records.series_label(key[:3] + ("{}",)) if method else records.series_label(key)
            return (unit, key[0], plain, order.get(method.removesuffix("+logn"), -1), method, -(step or 0))
        steps = len({step for _, _, step in curves})
        for (unit, key, step), points in sorted(curves.items(), key=rank):
            out[unit].append((i, run, key, points, series_label(run, key, step, steps)))
    return dict(sorted(out.items()))


def perplexity_figure(runs: list[dict], paper_mode: str = "auto"):
    """Perplexity against evaluation length, log-log, one panel per unit: each curve its own colour
    and marker, each run its own line style; the paper's curves thin, in a style of their own."""
    groups = _by_unit(runs)
    fig, axes = plots.panels(list(groups))
    for unit, entries in groups.items():
        ax, (name, token), drawn_paper = axes[unit], unit_names(unit), set()
        panel_runs = list({i: run for i, run, _, _, _ in entries}.items())
        run_index = {i: n for n, (i, _) in enumerate(panel_runs)}
        curves, colours, shared = 0, {}, _one_run_of_methods(entries)
        for i, run, key, points, label in entries:
            label = method_of(key) if shared else label
            xs = [r["eval_length"] for r in points]
            several = any(r.get("ppl_spread", {}).get("n", 1) > 1 for r in points)
            method = method_of(key)
            if method:  # a method and its log-n form: one colour, log-n dashed
                colour = colours.setdefault((i, key[:3], method.removesuffix("+logn")), curves)
                style = plots.style(colour, 2 * run_index[i] + method.endswith("+logn"))
                curves += colour == curves
            else:
                style, curves = plots.style(curves, run_index[i]), curves + 1
            ax.plot(xs, [r["ppl"] for r in points], ms=4, label=label + (": mean, band min-max" if several else ""),
                    **style)
            if several:
                ax.fill_between(xs, [r["ppl_spread"]["min"] for r in points], [r["ppl_spread"]["max"] for r in points],
                                color=style["color"], alpha=0.15, lw=0)
            ref = paper_curve(run, unit, key, paper_mode)
            ref_key = (run["scheme"], run["train_length"], key[1] == "nonoverlapping")
            if ref and ref_key not in drawn_paper:
                drawn_paper.add(ref_key)
                ax.plot([x for x, _ in ref], [y for _, y in ref], ms=4, alpha=0.7, lw=1,
                        **{**plots.style(curves), "ls": plots.PUBLISHED},
                        label=f"{paper.CITATION}: {run['scheme']} (L={run['train_length']}), "
                              f"WikiText-103 valid, word-level" + ("" if ref_key[2] else ", stride 1"))
                curves += 1
        plots.length_axes(ax, [run["train_length"] for _, run in panel_runs])
        plots.format_ppl_axis(ax)
        ax.set_xlabel(f"evaluation length L_valid ({token}s)")
        ax.set_ylabel(f"perplexity per {token} (log scale)")
        ax.set_title(title(f"{name}-level perplexity vs. evaluation length", [run for _, run in panel_runs], shared),
                     fontsize=10)
        plots.legend_beside(ax)
    return fig


def _one_run_of_methods(entries: list) -> str:
    """Where a panel's curves are one run's training-free methods over the same tokens, what they share
    (the run's label, first N tokens, the split: the panel's title names it, the legend only the
    method); else ''."""
    if len({(i, key[:3]) for i, _, key, _, _ in entries}) != 1 or not all(method_of(e[2]) for e in entries):
        return ""
    _, run, key, _, _ = entries[0]
    return series_label(run, key[:3] + ("{}",), None, 1)


def positions_figure(runs: list[dict]):
    """Mean loss against position inside the window, one panel per unit, at each run's longest
    nonoverlapping length without eval-time overrides: where a scheme stops extrapolating, and the
    high loss of the first tokens (early token curse)."""
    groups = defaultdict(list)
    for i, run in enumerate(runs):
        candidates = [r for r in run["records"] if r["stride"] == r["eval_length"] and r.get("position_nll")
                      and not r.get("overrides")]
        newest = max((r.get("step", 0) for r in candidates), default=0)
        candidates = [r for r in candidates if r.get("step", 0) == newest]  # one checkpoint: the newest
        for unit in sorted({r["tokenizer"] for r in candidates}):
            groups[unit].append((i, run, max((r for r in candidates if r["tokenizer"] == unit),
                                             key=lambda r: r["eval_length"])))
    fig, axes = plots.panels(sorted(groups))
    for unit, entries in sorted(groups.items()):
        ax, (name, token) = axes[unit], unit_names(unit)
        for n, (i, run, r) in enumerate(entries):
            xs = [((a + 1) * (b + 1)) ** 0.5 for a, b, _ in r["position_nll"]]
            ax.plot(xs, [v for _, _, v in r["position_nll"]], ms=4, markevery=max(1, len(xs) // 8),
                    label=f"{run['label']}, L_valid={r['eval_length']}", **plots.style(n, n))
        panel_runs = [run for _, run, _ in entries]
        plots.length_axes(ax, [run["train_length"] for run in panel_runs])
        plots.format_linear_axis(ax.yaxis)
        ax.set_xlabel(f"position inside the evaluation window ({token} index + 1)")
        ax.set_ylabel(f"mean loss (nats per {token})")
        ax.set_title(title(f"{name}-level loss by position inside the window", panel_runs, "nonoverlapping"),
                     fontsize=10)
        plots.legend_beside(ax)
    return fig


def table(runs: list[dict], paper_mode: str = "auto") -> str:
    """Markdown: one table per (unit, split, series); rows = L_valid, columns = runs (Table 2 style)
    with their checkpoint step (a run evaluated at two checkpoints: a column each), word-level
    perplexity beside it for byte / BPE runs on WikiText, and the paper's number where it has one.
    The training-free methods of a series share one table, a column per run and method (one run's:
    headed by the method alone), their word-level perplexity in a second table below it."""
    tables = defaultdict(list)
    for unit, entries in _by_unit(runs).items():
        for _, run, key, points, _ in entries:
            method = json.loads(key[3]).get("method") if key[3].startswith('{"method"') else None
            tables[(unit, key[:3] + ('{"method": "*"}',) if method else key)].append((run, points, method))
    blocks = []
    for (unit, key), columns in tables.items():
        header, getters, papers, repeated = ["L_valid"], [], set(), False
        words = []  # a methods table's word-level columns: a table of their own below it
        one_run = len({id(run) for run, _, _ in columns}) == 1 and all(m for _, _, m in columns)
        for run, points, method in columns:
            pts = {r["eval_length"]: r for r in points}
            note = checkpoint_note(points)
            name = method if one_run else f"{run['label']}{', ' + method if method else ''}"
            header.append(name if one_run else f"{name} ({unit} ppl{', ' + note if note else ''})")
            getters.append(_ppl_of(pts))
            repeated = repeated or any(r.get("same_as") for r in points)
            if run["wikitext"] and any("word_ppl" in r for r in points):
                if method:
                    words.append((name, _ppl_of(pts, "word_ppl")))
                else:
                    header.append(f"{run['label']} (word ppl)")
                    getters.append(_ppl_of(pts, "word_ppl"))
            ref = dict(paper_curve(run, unit, key, paper_mode))
            if ref and (run["scheme"], run["train_length"]) not in papers:  # once beside a run's checkpoints
                papers.add((run["scheme"], run["train_length"]))
                header.append(f"{paper.CITATION} (word ppl)")
                getters.append(ref.get)
        series = records.series_label(key).replace(", *", ", training-free methods")
        if one_run:
            run = columns[0][0]
            note = checkpoint_note([r for _, pts, _ in columns for r in pts])
            series += f", {run['label']}{', ' + note if note else ''}"
        text_runs, details = [run for run, _, _ in columns], f"{key[0]}, {series}"
        if key[0] in bands.TEXTS:  # not the run's dataset: the documents scored in place of its split
            text_runs, details = [{**run, "dataset": bands.TEXTS[key[0]]} for run in text_runs], series
        heading = title(f"{unit_names(unit)[0]}-level perplexity", text_runs, details, labels_in="column headers")
        lengths = sorted({r["eval_length"] for _, points, _ in columns for r in points})
        lines = [f"### {heading}", ""] + _grid(header, getters, lengths)
        if words:
            lines += ["", "Word-level perplexity of the same evaluations (WikiText's words):", ""]
            lines += _grid(["L_valid"] + [name for name, _ in words], [get for _, get in words], lengths)
        tokens = sorted({r["tokens"] for _, points, _ in columns for r in points})
        lines += ["", f"{unit_names(unit)[1].capitalize()}s scored per cell: {', '.join(f'{t:,}' for t in tokens)}."]
        if any("ppl_spread" in r for _, points, _ in columns for r in points):
            lines.append("mean ± std (n): over the n seeds of a run's config (runs that differ only in `seed`), "
                         "std the sample standard deviation; the plot's band spans the lowest to the highest seed.")
        if repeated:
            lines.append("*: the method sets nothing at this length (a factor of 1 within the window): the model as "
                         "evaluated without it, scored once and shown in its column too.")
        if any(paper_curve(run, unit, key, paper_mode) for run, _, _ in columns):
            lines.append(f"{paper.CITATION}: WikiText-103 valid, 247M-parameter word-level model"
                         + ("" if key[1] == "nonoverlapping" else ", stride 1") + ".")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def _grid(header: list[str], getters: list, lengths: list[int]) -> list[str]:
    """A markdown table: a row per length, a column per getter."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for length in lengths:
        lines.append("| " + " | ".join([str(length)] + [_cell(get(length)) for get in getters]) + " |")
    return lines


def _ppl_of(pts: dict[int, dict], field: str = "ppl"):
    """The table cell getter of one column: its perplexity (`field`) at a length, marked * where the
    record repeats another method's (`same_as`); a run of several seeds: mean ± std (n)."""
    def get(length):
        r = pts.get(length)
        if r is None or field not in r:
            return None
        if f"{field}_spread" in r:
            s = r[f"{field}_spread"]
            return f"{s['mean']:.2f} ± {s['std']:.2f} ({s['n']})" + ("*" if r.get("same_as") else "")
        return f"{r[field]:.2f}*" if r.get("same_as") else r[field]
    return get


def _runs_note(run: dict) -> str:
    """'`runs/a` (dataset, unit)'; a run of several seeds: each folder, then ', N seeds' in the brackets."""
    folders = ", ".join(f"`{w}`" for w in run.get("workdirs", [run["workdir"]]))
    seeds = f", {len(run['members'])} seeds" if "members" in run else ""
    return f"{folders} ({run['dataset']}, {run['tokenizer']}{seeds})"


def _cell(value) -> str:
    return "" if value is None else value if isinstance(value, str) else f"{value:.2f}"


def write(runs: list[dict], out: pathlib.Path, paper_mode: str = "auto") -> dict:
    """OUT/ppl_vs_length.png, OUT/loss_by_position.png and OUT/ppl_vs_length.md of `load_runs`' runs, and
    OUT/ppl_by_band.md where records hold the loss by position band (experiment/report/bands.py)."""
    plots.save(perplexity_figure(runs, paper_mode), out / "ppl_vs_length.png")
    plots.save(positions_figure(runs), out / "loss_by_position.png")
    files.write_atomically(out / "ppl_vs_length.md", "# Perplexity vs. evaluation length\n\n"
                           + "Runs: " + ", ".join(_runs_note(r) for r in runs) + "\n\n" + table(runs, paper_mode))
    return {"png": str(out / "ppl_vs_length.png"), "md": str(out / "ppl_vs_length.md"),
            "positions_png": str(out / "loss_by_position.png"), **bands.write(runs, out)}
