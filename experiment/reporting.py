"""Perplexity-vs-length plots and tables from one or more run directories, with the published
curves of Press et al. (2022) beside ours where scheme and training length match."""
from __future__ import annotations

import json
import pathlib
from collections import defaultdict

from experiment import config_util, paper

PAPER_MODES = ("auto", "always", "never")


def load_runs(workdirs: list[str | pathlib.Path]) -> list[dict]:
    """[{label, scheme, train_length, corpus, tokenizer, records}] for every workdir with results."""
    runs = []
    for workdir in map(pathlib.Path, workdirs):
        path = workdir / "eval" / "extrapolation.json"
        if not path.exists():
            raise FileNotFoundError(f"{workdir} has no eval/extrapolation.json; run "
                                    f"python eval_extrapolate.py --workdir {workdir} first")
        config = config_util.load_config(workdir / "config.json")
        data = config.data
        corpus = data.name if data.source in ("builtin", "hf") else pathlib.Path(data.path).name
        runs.append({"label": f"{config.posenc.name} (L={config.train.seq_len})",
                     "scheme": config.posenc.name, "train_length": int(config.train.seq_len),
                     "corpus": f"{corpus}{'/' + data.hf_config if data.get('hf_config') else ''}",
                     "tokenizer": data.tokenizer, "workdir": str(workdir),
                     "records": json.loads(path.read_text())})
    labels = [r["label"] for r in runs]
    for run in runs:  # same scheme and L in two workdirs: tell them apart by folder name
        if labels.count(run["label"]) > 1:
            run["label"] += f" [{pathlib.Path(run['workdir']).name}]"
    return runs


def on_wikitext(run: dict) -> bool:
    return "wikitext" in run["corpus"].lower()


def metric(record: dict, run: dict) -> float:
    """What the plot shows: token-level perplexity (the table adds word-level for byte / BPE runs)."""
    return record["ppl"]


def _series(run: dict):
    """{(split, kind): sorted [(eval_length, record)]}, kind = 'nonoverlapping' or 'stride S'."""
    out = defaultdict(list)
    for r in run["records"]:
        kind = "nonoverlapping" if r["stride"] == r["eval_length"] else f"stride {r['stride']}"
        if r.get("max_tokens"):
            kind += f", first {r['max_tokens']:,} tokens"
        if r.get("overrides"):
            kind += ", " + ", ".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(r["overrides"].items()))
        out[(r.get("split", "valid"), kind)].append((r["eval_length"], r))
    return {k: sorted(v, key=lambda x: x[0]) for k, v in out.items()}


def paper_curve(run: dict, kind: str, mode: str) -> list[tuple[int, float]]:
    """The paper's matching curve: nonoverlapping, or its stride-1 sliding window for any stride
    run; 'auto' only for word-level runs on WikiText (the paper's data and units: its L_valid
    counts words, so a byte or BPE run's lengths are not the same axis)."""
    if mode == "never" or (mode == "auto" and not (on_wikitext(run) and run["tokenizer"] == "word")):
        return []
    return paper.curve(run["scheme"], run["train_length"], sliding=not kind.startswith("nonoverlapping"))


def _axes_lengths(ax, runs):
    for length in sorted({run["train_length"] for run in runs}):
        ax.axvline(length, color="gray", ls="--", lw=0.8)
        ax.text(length, 1.0, f" L={length}", transform=ax.get_xaxis_transform(), va="top",
                fontsize=8, color="gray")
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)


def plot(runs: list[dict], path: pathlib.Path, paper_mode: str = "auto") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5))
    drawn_paper = set()
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        for (split, kind), points in sorted(_series(run).items()):
            ax.plot([x for x, _ in points], [metric(r, run) for _, r in points],
                    "-" if kind.startswith("nonoverlapping") else ":", marker="o", ms=3, color=color,
                    label=run["label"] + ("" if kind == "nonoverlapping" else f", {kind}")
                    + ("" if split == "valid" else f", {split}"))
            ref = paper_curve(run, kind, paper_mode)
            key = (run["scheme"], run["train_length"], kind.startswith("nonoverlapping"))
            if ref and key not in drawn_paper:
                drawn_paper.add(key)
                ax.plot([x for x, _ in ref], [y for _, y in ref], "--", color=color, alpha=0.6, lw=1,
                        label=f"{paper.CITATION}: {run['scheme']} (L={run['train_length']})"
                              + ("" if kind.startswith("nonoverlapping") else ", stride 1"))
    _axes_lengths(ax, runs)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length L_valid (tokens)")
    ax.set_ylabel("perplexity per token (log scale)")
    corpora = sorted({f"{r['corpus']}, {r['tokenizer']}" for r in runs})
    ax.set_title(f"Perplexity vs. evaluation length ({'; '.join(corpora)})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_positions(runs: list[dict], path: pathlib.Path) -> None:
    """Mean loss against position inside the window, at each run's longest nonoverlapping length:
    where a scheme stops extrapolating, and the high loss of the first tokens (early token curse)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5))
    for i, run in enumerate(runs):
        candidates = [r for r in run["records"] if r["stride"] == r["eval_length"] and r.get("position_nll")
                      and not r.get("overrides")]
        if not candidates:
            continue
        r = max(candidates, key=lambda r: r["eval_length"])
        xs = [((a + 1) * (b + 1)) ** 0.5 for a, b, _ in r["position_nll"]]
        ax.plot(xs, [v for _, _, v in r["position_nll"]], color=f"C{i % 10}",
                label=f"{run['label']}, L_valid={r['eval_length']}")
    _axes_lengths(ax, runs)
    ax.set_xlabel("position inside the evaluation window (token index + 1)")
    ax.set_ylabel("mean loss (nats per token)")
    ax.set_title("Loss by position inside the window (nonoverlapping)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(runs: list[dict], paper_mode: str = "auto") -> str:
    """Markdown: one table per (split, evaluation kind); rows = L_valid, columns = runs (Table 2
    style): token-level perplexity, word-level perplexity for byte / BPE runs on WikiText, and the
    paper's number where it has one."""
    blocks = []
    for split, kind in sorted({k for run in runs for k in _series(run)}):
        header, getters = ["L_valid"], []
        for run in runs:
            pts = dict(_series(run).get((split, kind), []))
            if not pts:
                continue
            header.append(f"{run['label']} ({run['tokenizer']} ppl)")
            getters.append(lambda l, pts=pts: pts[l]["ppl"] if l in pts else None)
            if on_wikitext(run) and any("word_ppl" in r for r in pts.values()):
                header.append(f"{run['label']} (word ppl)")
                getters.append(lambda l, pts=pts: pts[l].get("word_ppl") if l in pts else None)
            ref = dict(paper_curve(run, kind, paper_mode))
            if ref:
                header.append(f"{paper.CITATION} (word ppl)")
                getters.append(ref.get)
        lengths = sorted({l for run in runs for l, _ in _series(run).get((split, kind), [])})
        lines = [f"### {split}, {kind}", "", "| " + " | ".join(header) + " |",
                 "|" + "---:|" * len(header)]
        for length in lengths:
            cells = [str(length)] + [("" if (v := get(length)) is None else f"{v:.2f}") for get in getters]
            lines.append("| " + " | ".join(cells) + " |")
        tokens = sorted({r["tokens"] for run in runs for _, r in _series(run).get((split, kind), [])})
        lines += ["", f"Tokens scored per cell: {', '.join(f'{t:,}' for t in tokens)}."]
        if any(paper_curve(run, kind, paper_mode) for run in runs):
            lines.append(f"{paper.CITATION}: WikiText-103 valid, 247M-parameter word-level model"
                         + ("" if kind.startswith("nonoverlapping") else ", stride 1") + ".")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def write_report(workdirs: list[str | pathlib.Path], out: str | pathlib.Path,
                 paper_mode: str = "auto") -> dict:
    if paper_mode not in PAPER_MODES:
        raise ValueError(f"unknown paper mode {paper_mode!r}; valid: {', '.join(PAPER_MODES)}")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(workdirs)
    plot(runs, out / "ppl_vs_length.png", paper_mode)
    plot_positions(runs, out / "loss_by_position.png")
    (out / "ppl_vs_length.md").write_text(
        "# Perplexity vs. evaluation length\n\n"
        + "Runs: " + ", ".join(f"`{r['workdir']}` ({r['corpus']}, {r['tokenizer']})" for r in runs)
        + "\n\n" + table(runs, paper_mode))
    return {"png": str(out / "ppl_vs_length.png"), "md": str(out / "ppl_vs_length.md"),
            "positions_png": str(out / "loss_by_position.png")}
