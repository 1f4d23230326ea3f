"""RULER needles placed by design (experiment/evals/ruler.py --needle_distances): each method's score by
the needle's distance from the prompt's end, and every pair of methods compared on the same questions
(experiment/report/pairs.py) over all of a cell's questions and over those past the model's window.

A cell: (task, length, template, seed, the distances asked, questions per prefill); its columns are the
methods (or eval-time options) that answered it. Questions are matched by their index, and a column
whose measured distances differ from the longest column's (another tokenizer, another build) is refused;
a column with fewer questions (asked before the cell was extended) has the longest's first ones, and
its pairs are taken on those.
A band's interval is Wilson's where each question had its own prefill (prompts whose book stretches
share text counted as one: pairs.shared_text_groups), else a bootstrap over groups; the pairs test the
same groups.
RULER's random placements are never pooled with these (experiment/report/ruler.py keeps them apart).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from experiment.report import pairs
from experiment.report.seeds import wilson


def is_designed(record: dict) -> bool:
    return record.get("placement") == "designed"


def cell_key(record: dict) -> tuple:
    return (record["task"], int(record["eval_length"]), record.get("template", "base"), record.get("seed"),
            tuple(record.get("needle_distances", ())), int(record.get("questions_per_prefill", 1)),
            record.get("stretches", "random"))


def _interval(scores: np.ndarray, clusters: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """Wilson's over the groups (prompts whose book stretches share text counted as one prompt, at the
    group's mean score: the most cautious reading; over the prompts where none share text), or a
    bootstrap over the groups where a prefill served several questions."""
    if len(np.unique(clusters)) < len(scores):
        return pairs.cluster_bootstrap(scores, groups)
    count = len(np.unique(groups))
    return wilson(float(scores.mean()) * count, count)


def _band_cell(scores: np.ndarray, clusters: np.ndarray, groups: np.ndarray) -> str:
    if not len(scores):
        return "-"
    if len(np.unique(clusters)) < 2 < len(scores):
        return f"{100 * scores.mean():.0f} (one context: no interval) ({len(scores)})"
    low, high = _interval(scores, clusters, groups)
    return f"{100 * scores.mean():.0f} [{100 * low:.0f}, {100 * high:.0f}] ({len(scores)})"


def cell_tables(key: tuple, by_column: dict[str, dict]) -> str:
    """One cell's tables: scores by distance band per column, then the pairs (all, and past the window)."""
    task, length, template, seed, asked, k, stretches = key
    first = max(by_column.values(), key=lambda r: len(r["distances"]))  # the longest: every other's questions begin it
    window = int(first.get("window", 0))
    distances = np.asarray(first["distances"])
    clusters = np.asarray(first["contexts"])
    groups = pairs.shared_text_groups(first["contexts"], first.get("spans"), first.get("haystack_words"))
    for name, record in by_column.items():
        if list(record["distances"]) != list(first["distances"])[:len(record["distances"])]:
            raise ValueError(f"{task} L={length}: {name}'s questions are not the first column's (their measured "
                             f"distances differ); compare methods on the same prompts (same seed and tokenizer)")
    targets = np.asarray(first["targets"])
    bands = sorted(set(targets.tolist()))
    counts = sorted({len(r["distances"]) for r in by_column.values()})
    lines = [f"### {task}, L = {length:,}, needles at {', '.join(asked)} ({k} question(s) a prefill, "
             f"{len(np.unique(clusters))} contexts, {'/'.join(map(str, counts))} questions; window {window:,}"
             f"{'; book stretches drawn apart' if stretches == 'disjoint' else ''})\n",
             *([f"The contexts' book stretches share text in {len(np.unique(groups))} groups (largest "
                f"{int(np.bincount(groups).max())} contexts): the pairs test groups, not contexts.\n"]
               if len(np.unique(groups)) < len(np.unique(clusters)) else []),
             "Score in percent [95%] (questions) by the distance asked; the measured distance of each question is in "
             "the records (`distances`).\n",
             "| method | " + " | ".join(f"{d:,} back{' (past the window)' if window and d > window else ''}"
                                      for d in bands) + " | all |",
             "|---|" + "---|" * (len(bands) + 1)]
    for name, record in by_column.items():
        scores = np.asarray(record["scores"], np.float64)
        n = len(scores)
        t, c, g = targets[:n], clusters[:n], groups[:n]
        cells = [_band_cell(scores[t == d], c[t == d], g[t == d]) for d in bands]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_band_cell(scores, c, g)} |")
    lines.append("")
    if len(by_column) > 1:
        columns = {name: np.asarray(r["scores"], np.float64) for name, r in by_column.items()}
        lines += ["Pairs, every question:\n", pairs.pairs_table(columns, groups)]
        far = distances > window if window else np.zeros(len(distances), bool)
        if far.any() and not far.all():
            lines += [f"Pairs, the {int(far.sum())} questions past the window (measured distance > {window:,}):\n",
                      pairs.pairs_table({n: s[far[:len(s)]] for n, s in columns.items()}, groups[far])]
    return "\n".join(lines)


def tables(by_column: dict[str, list[dict]]) -> str:
    """Every designed cell of the columns ({column: its records}), one section each."""
    cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for name, records in by_column.items():
        for r in records:
            if is_designed(r):
                cells[cell_key(r)][name] = r
    if not cells:
        return ""
    out = ["## Needles placed by distance (`--needle_distances`)\n",
           "Each asked needle sits at a chosen distance from the prompt's end (RULER's random depths are not pooled "
           "with these). A pair is **separated** where its test says so at 95%: the exact McNemar test where each "
           "question had its own prefill and shares no text with another, else the exact sign test over groups "
           "(the questions of one prefill, and contexts whose book stretches share text, move together); the "
           "interval is a bootstrap over the same units. A score's interval by distance is Wilson's with each group "
           "counted as one prompt (a bootstrap over groups where a prefill served several questions).\n"]
    for key in sorted(cells, key=lambda c: (c[1], c[0], c[2], str(c[3]), c[4], c[5], c[6])):
        out.append(cell_tables(key, cells[key]))
    return "\n".join(out)
