"""Perplexity-vs-length plots and tables from one or more run directories: one plot panel and separate
tables per unit of perplexity (byte, BPE token, word), and the published curves of Press et al. (2022)
beside ours only where dataset, split, unit and training length match theirs."""
from __future__ import annotations

import math
import pathlib
import re
from collections import defaultdict

import posenc
from experiment import init_from, paper, records
from experiment.run import RunDir

PAPER_MODES = ("auto", "always", "never")
# tokenizer kind -> (name in titles, what one token is)
UNITS = {"byte": ("byte", "byte"), "bpe": ("BPE", "BPE token"), "word": ("word", "word")}


def unit_names(unit: str) -> tuple[str, str]:
    return UNITS.get(unit, (unit, f"{unit} token"))


def dataset_name(data) -> str:
    """A run's dataset as shown: the HF name (/config), the builtin name, or the local folder name."""
    if data.source == "hf":
        return data.name + (f"/{data.hf_config}" if data.get("hf_config") else "")
    return data.name if data.source == "builtin" else pathlib.Path(data.path).name


def _dataset_text(data) -> str:
    fields = [data.name, data.get("hf_config", "")] if data.source in ("hf", "builtin") else [data.path]
    return " ".join(str(f) for f in fields).lower()


def load_runs(workdirs: list[str | pathlib.Path]) -> list[dict]:
    """[{label, scheme, train_length, dataset, wikitext, wikitext103, tokenizer, workdir, records}]
    for every workdir with results; labels name the dataset when the runs do not share one."""
    runs = []
    for workdir in map(pathlib.Path, workdirs):
        run_dir = RunDir(workdir)
        if not run_dir.results_path.exists():
            raise FileNotFoundError(f"{workdir} has no evaluation results; run "
                                    f"python eval_extrapolate.py --workdir {workdir} first")
        config = run_dir.load_config()
        text = _dataset_text(config.data)
        recs = run_dir.results()
        for r in recs:
            r.setdefault("tokenizer", config.data.tokenizer)
        runs.append({"scheme": config.posenc.name, "train_length": int(config.train.seq_len),
                     "dataset": dataset_name(config.data), "wikitext": "wikitext" in text,
                     "wikitext103": bool(re.search(r"(wikitext|wt)[-_ ]?103", text)),
                     "tokenizer": config.data.tokenizer, "workdir": str(workdir), "records": recs,
                     "options": scheme_options_note(config.posenc), "origin": init_from.origin_of(run_dir)})
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


def scheme_options_note(posenc_cfg) -> str:
    """The options of the schemes a run uses that differ from their defaults: 'pi_factor=0.25'."""
    notes = []
    for name in posenc.used_schemes(posenc_cfg):
        defaults = posenc.default_config(name).get(name, {})
        given = posenc_cfg.get(name, {})
        notes += [f"{k}={given[k]:g}" if isinstance(given[k], float) else f"{k}={given[k]}"
                  for k in sorted(given.keys()) if k in defaults and given[k] != defaults[k] and k != "base"]
    return ", ".join(notes)


def series(run: dict) -> dict[tuple, list[dict]]:
    """{(unit, records.series_key): the run's records of that curve, sorted by eval_length}."""
    out = defaultdict(list)
    for r in run["records"]:
        out[(r["tokenizer"], records.series_key(r))].append(r)
    return {k: sorted(v, key=lambda r: r["eval_length"]) for k, v in out.items()}


def checkpoint_note(points: list[dict]) -> str:
    """'step 1000', 'mixed checkpoints: steps 2, 4', or '' where records carry no step."""
    steps = sorted({int(r["step"]) for r in points if "step" in r})
    if len(steps) > 1:
        return f"mixed checkpoints: steps {', '.join(map(str, steps))}"
    return f"step {steps[0]}" if steps else ""


def paper_curve(run: dict, unit: str, key: tuple, mode: str) -> list[tuple[int, float]]:
    """The paper's curve for one series of a run (nonoverlapping, or its stride-1 sliding window for
    any stride); 'auto' only for word-level WikiText-103 validation runs, as the paper's."""
    split, kind = key[0], key[1]
    if mode == "never" or (mode == "auto" and not (run["wikitext103"] and split == "valid" and unit == "word")):
        return []
    return paper.curve(run["scheme"], run["train_length"], sliding=kind != "nonoverlapping")


def _plain(value: float, _pos=None) -> str:
    return str(int(round(value))) if abs(value - round(value)) < 1e-6 * max(1.0, value) else f"{value:.3g}"


def format_length_axis(ax) -> None:
    """x: log base 2, plain labels at powers of two (64, 128, ...)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(FuncFormatter(_plain))
    ax.xaxis.set_minor_formatter(NullFormatter())


def format_ppl_axis(ax) -> None:
    """y: log scale with plain labels (10, 20, ...); call after plotting. Short ranges also label
    the ticks between powers of ten (e.g. 8, 9, 10, 12, 15, 20)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    decades = math.log10(high / low)
    subs, labelled = next((s, lab) for limit, s, lab in (
        (0.5, (1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9), True), (1.2, (1.5, 2, 3, 4, 5, 6, 7, 8), True),
        (2.5, (2, 3, 5), True), (4, (2, 5), True), (math.inf, tuple(range(2, 10)), False)) if decades < limit)
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_minor_formatter(FuncFormatter(_plain) if labelled else NullFormatter())


def _mark_train_lengths(ax, runs):
    for length in sorted({run["train_length"] for run in runs}):
        ax.axvline(length, color="gray", ls="--", lw=0.8)
        ax.text(length, 1.0, f" L={length}", transform=ax.get_xaxis_transform(), va="top",
                fontsize=8, color="gray")
    format_length_axis(ax)
    ax.grid(True, which="both", alpha=0.3)


def _by_unit(runs: list[dict]) -> dict[str, list[tuple[int, dict, tuple, list[dict]]]]:
    """{unit: [(run index, run, series key, points)]}, units and series in a stable order
    (unit, split, then series label: nonoverlapping before strides)."""
    out = defaultdict(list)
    for i, run in enumerate(runs):
        for (unit, key), points in sorted(series(run).items(),
                                          key=lambda kv: (kv[0][0], kv[0][1][0], records.series_label(kv[0][1]))):
            out[unit].append((i, run, key, points))
    return dict(sorted(out.items()))


def _panels(units: list[str]):
    """A figure with one panel per unit, stacked: (figure, {unit: Axes})."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4.5 * max(1, len(units))))
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(1, len(units)), 1, squeeze=False)
    return fig, dict(zip(units, axes[:, 0]))


def _title(what: str, runs: list[dict], details: str = "", labels_in: str = "legend") -> str:
    """'WHAT on DATASET, DETAILS', or 'WHAT (datasets differ: see legend), DETAILS'."""
    datasets = sorted({run["dataset"] for run in runs})
    return (what + (f" on {datasets[0]}" if len(datasets) == 1 else f" (datasets differ: see {labels_in})")
            + (f", {details}" if details else ""))


def _save(fig, path: pathlib.Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot(runs: list[dict], path: pathlib.Path, paper_mode: str = "auto") -> None:
    _save(perplexity_figure(runs, paper_mode), path)


def perplexity_figure(runs: list[dict], paper_mode: str = "auto"):
    """Perplexity against evaluation length, log-log, one panel per unit; the paper's curves dashed."""
    groups = _by_unit(runs)
    fig, axes = _panels(list(groups))
    for unit, entries in groups.items():
        ax, (name, token), drawn_paper = axes[unit], unit_names(unit), set()
        for i, run, key, points in entries:
            color, note = f"C{i % 10}", checkpoint_note(points)
            kind = records.series_label(key)
            ax.plot([r["eval_length"] for r in points], [r["ppl"] for r in points],
                    "-" if key[1] == "nonoverlapping" else ":", marker="o", ms=3, color=color,
                    label=run["label"] + ("" if kind == "nonoverlapping" else f", {kind}")
                    + ("" if key[0] == "valid" else f", {key[0]}")
                    + (f" ({note})" if note.startswith("mixed") else ""))
            ref = paper_curve(run, unit, key, paper_mode)
            ref_key = (run["scheme"], run["train_length"], key[1] == "nonoverlapping")
            if ref and ref_key not in drawn_paper:
                drawn_paper.add(ref_key)
                ax.plot([x for x, _ in ref], [y for _, y in ref], "--", color=color, alpha=0.6, lw=1,
                        label=f"{paper.CITATION}: {run['scheme']} (L={run['train_length']}), "
                              f"WikiText-103 valid, word-level" + ("" if ref_key[2] else ", stride 1"))
        panel_runs = [run for _, run, _, _ in entries]
        _mark_train_lengths(ax, panel_runs)
        format_ppl_axis(ax)
        ax.set_xlabel(f"evaluation length L_valid ({token}s)")
        ax.set_ylabel(f"perplexity per {token} (log scale)")
        ax.set_title(_title(f"{name}-level perplexity vs. evaluation length", panel_runs), fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def plot_positions(runs: list[dict], path: pathlib.Path) -> None:
    _save(positions_figure(runs), path)


def positions_figure(runs: list[dict]):
    """Mean loss against position inside the window, one panel per unit, at each run's longest
    nonoverlapping length without eval-time overrides: where a scheme stops extrapolating, and the
    high loss of the first tokens (early token curse)."""
    groups = defaultdict(list)
    for i, run in enumerate(runs):
        candidates = [r for r in run["records"] if r["stride"] == r["eval_length"] and r.get("position_nll")
                      and not r.get("overrides")]
        for unit in sorted({r["tokenizer"] for r in candidates}):
            groups[unit].append((i, run, max((r for r in candidates if r["tokenizer"] == unit),
                                             key=lambda r: r["eval_length"])))
    fig, axes = _panels(sorted(groups))
    for unit, entries in sorted(groups.items()):
        ax, (name, token) = axes[unit], unit_names(unit)
        for i, run, r in entries:
            xs = [((a + 1) * (b + 1)) ** 0.5 for a, b, _ in r["position_nll"]]
            ax.plot(xs, [v for _, _, v in r["position_nll"]], color=f"C{i % 10}",
                    label=f"{run['label']}, L_valid={r['eval_length']}")
        panel_runs = [run for _, run, _ in entries]
        _mark_train_lengths(ax, panel_runs)
        ax.set_xlabel(f"position inside the evaluation window ({token} index + 1)")
        ax.set_ylabel(f"mean loss (nats per {token})")
        ax.set_title(_title(f"{name}-level loss by position inside the window", panel_runs, "nonoverlapping"),
                     fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def table(runs: list[dict], paper_mode: str = "auto") -> str:
    """Markdown: one table per (unit, split, series); rows = L_valid, columns = runs (Table 2 style)
    with their checkpoint step, word-level perplexity beside it for byte / BPE runs on WikiText, and
    the paper's number where it has one."""
    tables = defaultdict(list)
    for unit, entries in _by_unit(runs).items():
        for _, run, key, points in entries:
            tables[(unit, key)].append((run, points))
    blocks = []
    for (unit, key), columns in tables.items():
        header, getters = ["L_valid"], []
        for run, points in columns:
            pts = {r["eval_length"]: r for r in points}
            note = checkpoint_note(points)
            header.append(f"{run['label']} ({unit} ppl{', ' + note if note else ''})")
            getters.append(lambda l, pts=pts: pts[l]["ppl"] if l in pts else None)
            if run["wikitext"] and any("word_ppl" in r for r in points):
                header.append(f"{run['label']} (word ppl)")
                getters.append(lambda l, pts=pts: pts[l].get("word_ppl") if l in pts else None)
            ref = dict(paper_curve(run, unit, key, paper_mode))
            if ref:
                header.append(f"{paper.CITATION} (word ppl)")
                getters.append(ref.get)
        title = _title(f"{unit_names(unit)[0]}-level perplexity", [run for run, _ in columns],
                       f"{key[0]}, {records.series_label(key)}", labels_in="column headers")
        lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
        for length in sorted({r["eval_length"] for _, points in columns for r in points}):
            cells = [str(length)] + [("" if (v := get(length)) is None else f"{v:.2f}") for get in getters]
            lines.append("| " + " | ".join(cells) + " |")
        tokens = sorted({r["tokens"] for _, points in columns for r in points})
        lines += ["", f"{unit_names(unit)[1].capitalize()}s scored per cell: {', '.join(f'{t:,}' for t in tokens)}."]
        if any(paper_curve(run, unit, key, paper_mode) for run, _ in columns):
            lines.append(f"{paper.CITATION}: WikiText-103 valid, 247M-parameter word-level model"
                         + ("" if key[1] == "nonoverlapping" else ", stride 1") + ".")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def write_report(workdirs: list[str | pathlib.Path], out: str | pathlib.Path,
                 paper_mode: str = "auto") -> dict:
    """Write OUT/ppl_vs_length.png, OUT/loss_by_position.png and OUT/ppl_vs_length.md, and
    OUT/attention_<run>.png and the passkey report (experiment/passkey_report.py) for the runs
    that have those results."""
    if paper_mode not in PAPER_MODES:
        raise ValueError(f"unknown paper mode {paper_mode!r}; valid: {', '.join(PAPER_MODES)}")
    out = pathlib.Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder")
    runs = load_runs(workdirs)
    out.mkdir(parents=True, exist_ok=True)
    plot(runs, out / "ppl_vs_length.png", paper_mode)
    plot_positions(runs, out / "loss_by_position.png")
    (out / "ppl_vs_length.md").write_text(
        "# Perplexity vs. evaluation length\n\n"
        + "Runs: " + ", ".join(f"`{r['workdir']}` ({r['dataset']}, {r['tokenizer']})" for r in runs)
        + "\n\n" + table(runs, paper_mode))
    from experiment.diagnostics_report import write_attention_plots  # matplotlib-heavy: only here
    from experiment.passkey_report import write_passkey_report
    paths = {"png": str(out / "ppl_vs_length.png"), "md": str(out / "ppl_vs_length.md"),
             "positions_png": str(out / "loss_by_position.png"),
             "attention_pngs": write_attention_plots(runs, out)}
    with_passkey = [run["workdir"] for run in runs if RunDir(run["workdir"]).passkey_path.exists()]
    if with_passkey:
        paths["passkey"] = write_passkey_report(with_passkey, out)
    return paths
