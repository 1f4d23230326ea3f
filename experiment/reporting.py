"""Perplexity-vs-length plots and tables from one or more run directories."""
from __future__ import annotations

import json
import pathlib
from collections import defaultdict

from experiment import config_util


def load_runs(workdirs: list[str | pathlib.Path]) -> list[dict]:
    """[{label, scheme, train_length, records}] for every workdir with evaluation results."""
    runs = []
    for workdir in map(pathlib.Path, workdirs):
        path = workdir / "eval" / "extrapolation.json"
        if not path.exists():
            raise FileNotFoundError(f"{workdir} has no eval/extrapolation.json; run "
                                    f"python eval_extrapolate.py --workdir {workdir} first")
        config = config_util.load_config(workdir / "config.json")
        runs.append({"label": f"{config.posenc.name} (L={config.train.seq_len})",
                     "scheme": config.posenc.name, "train_length": int(config.train.seq_len),
                     "workdir": str(workdir), "records": json.loads(path.read_text())})
    labels = [r["label"] for r in runs]
    for run in runs:  # same scheme and L in two workdirs: tell them apart by folder name
        if labels.count(run["label"]) > 1:
            run["label"] += f" [{pathlib.Path(run['workdir']).name}]"
    return runs


def _series(run: dict):
    """{(split, kind): sorted [(eval_length, record)]}, kind = 'nonoverlapping' or 'stride S'."""
    out = defaultdict(list)
    for r in run["records"]:
        kind = "nonoverlapping" if r["stride"] == r["eval_length"] else f"stride {r['stride']}"
        out[(r.get("split", "valid"), kind)].append((r["eval_length"], r))
    return {k: sorted(v, key=lambda x: x[0]) for k, v in out.items()}


def plot(runs: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"nonoverlapping": "-"}
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        for (split, kind), points in sorted(_series(run).items()):
            xs = [x for x, _ in points]
            ys = [r["ppl"] for _, r in points]
            ax.plot(xs, ys, styles.get(kind, ":"), marker="o", ms=3, color=color,
                    label=f"{run['label']}" + ("" if kind == "nonoverlapping" else f", {kind}")
                          + ("" if split == "valid" else f", {split}"))
    for length in sorted({run["train_length"] for run in runs}):
        ax.axvline(length, color="gray", ls="--", lw=0.8)
        ax.text(length, 1.0, f" L={length}", transform=ax.get_xaxis_transform(), va="top",
                fontsize=8, color="gray")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length L_valid (tokens)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title("Perplexity vs. evaluation length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(runs: list[dict]) -> str:
    """Markdown: one table per (split, evaluation kind); rows = L_valid, columns = runs (Table 2 style)."""
    blocks = []
    keys = sorted({k for run in runs for k in _series(run)})
    for split, kind in keys:
        cols = [(run, dict(_series(run).get((split, kind), []))) for run in runs]
        cols = [(run, pts) for run, pts in cols if pts]
        lengths = sorted({l for _, pts in cols for l in pts})
        lines = [f"### {split}, {kind} (perplexity)", "",
                 "| L_valid | " + " | ".join(run["label"] for run, _ in cols) + " |",
                 "|---:|" + "---:|" * len(cols)]
        for length in lengths:
            cells = []
            for run, pts in cols:
                r = pts.get(length)
                cells.append("" if r is None else f"{r['ppl']:.2f}")
            lines.append(f"| {length} | " + " | ".join(cells) + " |")
        tokens = {pts[l]["tokens"] for _, pts in cols for l in pts}
        lines += ["", f"Tokens scored per cell: {', '.join(f'{t:,}' for t in sorted(tokens))}.", ""]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def write_report(workdirs: list[str | pathlib.Path], out: str | pathlib.Path) -> dict:
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(workdirs)
    plot(runs, out / "ppl_vs_length.png")
    body = table(runs)
    (out / "ppl_vs_length.md").write_text(
        "# Perplexity vs. evaluation length\n\n"
        + "Runs: " + ", ".join(f"`{r['workdir']}`" for r in runs) + "\n\n" + body)
    return {"png": str(out / "ppl_vs_length.png"), "md": str(out / "ppl_vs_length.md")}
