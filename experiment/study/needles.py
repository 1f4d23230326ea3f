"""Which needles each method found, by how far back they sat: the RULER needle records of a run,
their examples rebuilt (the same seed gives the same prompts) and each needle's distance from the
prompt's end measured in the model's tokens (corpora.ruler.needle_distances). A needle more than
the model's window back is one a method must reach past the window to find; LM-Infinite, whose
window is the model's, cannot (save its sink tokens). Needles placed by design (`--needle_distances`)
are left out: their records keep their measured distances, and experiment/report/ruler.py tabulates
them by distance.

    python -m experiment.study.needles RUN --out DIR     # writes DIR/needles.md
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from collections import defaultdict

from corpora import ruler
from experiment.evals.ruler import prompter as ruler_prompter, text_of
from experiment.report.ruler import column_name
from experiment.report.seeds import wilson
from experiment.store import files
from experiment.store.run import RunDir


def _percent(hits: float, count: int) -> str:
    low, high = wilson(hits, count)
    return f"{hits:g}/{count} [{100 * low:.0f}, {100 * high:.0f}]" if count else "-"


def needles_md(workdir: str) -> str:
    run = RunDir(workdir)
    config = run.load_config()
    window = int(config.train.seq_len)
    tokenizer = run.tokenizer(config.data, write=False)
    # needles placed by design (--needle_distances) are not at RULER's depths, which the rebuild below
    # assumes: their measured distances are in their records and in the RULER report's own section
    records = [r for r in run.records("ruler") if ruler.task(r["task"]).family == "niah"
               and r.get("placement") != "designed"]
    if not records:
        raise FileNotFoundError(f"{workdir} holds no RULER needle records; score one first "
                                f"(eval_extrapolate.py --ruler --ruler_tasks niah_single_1)")
    cells = defaultdict(dict)  # (task, length, template, seed) -> {column: per-example scores}
    for r in records:
        cells[(r["task"], int(r["eval_length"]), r["template"], r["seed"])][column_name(r)] = r["scores"]
    out = [f"# RULER needles by distance from the prompt's end ({workdir}; the model's window: {window:,} tokens)\n",
           "A needle's distance: the prompt's tokens from its value to the end. Past the window: farther back "
           "than the window, out of LM-Infinite's reach (it keeps the window and the first tokens). "
           "Scores are RULER's (the fraction of the example's values found); intervals 95% Wilson.\n"]
    summary = defaultdict(lambda: [0.0, 0, 0.0, 0])  # column -> found past, count past, found within, count within
    for (task, length, template, seed), by_column in sorted(cells.items()):
        count = len(next(iter(by_column.values())))
        prompter = ruler_prompter(text_of(run, tokenizer, template), template)
        built = ruler.build(task, length, count, seed, prompter)
        distances = [max(ruler.needle_distances(b, prompter)) for b in built]
        names = list(by_column)
        out += [f"\n## {task} at {length:,} ({template} template, seed {seed}, {count} examples)\n",
                "| example | needle tokens back | " + " | ".join(names) + " |",
                "|---:|---:|" + "---:|" * len(names)]
        for i in sorted(range(count), key=lambda i: -distances[i]):
            past = distances[i] > window
            cells_text = []
            for name in names:
                scores = by_column[name]
                cells_text.append("-" if i >= len(scores) else f"{scores[i]:g}")
                if i < len(scores) and length > window:
                    s = summary[(name, task, length)]
                    s[0 if past else 2] += scores[i]
                    s[1 if past else 3] += 1
            out.append(f"| {i} | {distances[i]:,}{' (past the window)' if past else ''} | " + " | ".join(cells_text) + " |")
    if summary:
        out += ["\n## Found past the window and within it (lengths beyond the window)\n",
                "| method | task | length | needles past the window found | within the window found |",
                "|---|---|---:|---:|---:|"]
        for (name, task, length), (hp, np_, hw, nw) in sorted(summary.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
            out.append(f"| {name} | {task} | {length:,} | {_percent(hp, np_)} | {_percent(hw, nw)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiment.study.needles")
    parser.add_argument("run")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        text = needles_md(args.run)
    except (FileNotFoundError, ruler.RulerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {write(text, args.out)}")
    return 0


def write(text: str, out: str | pathlib.Path) -> pathlib.Path:
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files.write_atomically(out / "needles.md", text)
    return out / "needles.md"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
