"""Perplexity by position band, and each training-free method against `direct` and against LM-Infinite
on the same tokens (OUT/ppl_by_band.md): the test of whether a method makes a model use the text past
its window, which a perplexity over the whole window does not show (a method that ignores the far
text, as LM-Infinite's window does, keeps it flat too).

Bands are positions inside the evaluation window relative to the window L the model was trained at
(before L, L-2L, 2L-4L, ...: experiment/store/bands.py). The comparisons are paired bootstraps over
the records' blocks of 512 tokens (experiment/report/bootstrap.py): a method's perplexity over its
reference's in per cent, with its 95% interval, in bold where the interval leaves out 0. Blocks of
one book are not independent, so each comparison is also given document by document (each book's
difference) with the interval that resamples documents, their blocks kept together.
"""
from __future__ import annotations

import pathlib
from collections import defaultdict

import numpy as np

from experiment.report import bootstrap
from experiment.report.runs import unit_names
from experiment.store import bands as bands_lib, files, records

REFERENCES = (("direct", "the model as trained (direct)"), ("lm_infinite", "LM-Infinite"))
TEXTS = {"books": "the four books of corpora/books.py"}  # documents scored in place of a run's split


def _method(record: dict) -> str:
    """The record's training-free method, else its series' label (eval-time options, or 'as trained')."""
    if record.get("method"):
        return record["method"]
    return records.series_label(("", "nonoverlapping", 0, records.curve_options(record))).removeprefix(
        "nonoverlapping").lstrip(", ") or "as trained"


def groups(run: dict) -> dict[tuple, dict[int, dict[str, dict]]]:
    """{(unit, split, stride kind, max_tokens, step): {eval_length: {method: record}}} of a run's records
    that hold bands: within a group every record scored the same tokens at a length."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for r in run["records"]:
        if r.get("band_nll"):
            split, kind, max_tokens, _ = records.series_key(r)
            out[(r["tokenizer"], split, kind, max_tokens, r.get("step"))][int(r["eval_length"])][_method(r)] = r
    return {key: dict(sorted(by_length.items())) for key, by_length in out.items()}


def _order(names) -> list[str]:
    return sorted(names, key=lambda n: (n != "direct", n != "as trained", n))


def _blocks(record: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    rows = record.get("block_nll")
    if not rows:
        return None
    first, tokens, loss = (np.array(col) for col in zip(*rows))
    return first, tokens, loss


def documents_of(record: dict, first: np.ndarray) -> np.ndarray:
    """Each block's document: where every document gave the same tokens (max_tokens each, as the books
    do), its windows taken in order by document; else each evaluation window counts as one."""
    windows = bootstrap.windows_of(first)
    count = int(windows.max()) + 1 if len(windows) else 0
    documents = int(record.get("documents") or 0)
    if documents and count % documents == 0 and int(record["tokens"]) == documents * int(record.get("max_tokens") or 0):
        return windows // (count // documents)
    return windows


def by_document(record: dict, reference: dict, train_length: int) -> dict[str, tuple[list[float], bootstrap.Difference]]:
    """{band label or 'all': (the difference in each document, nats per token; the bootstrap over
    documents)} of record against reference: the interval of a text whose blocks are not independent."""
    a, b = _blocks(record), _blocks(reference)
    if a is None or b is None or len(a[1]) != len(b[1]) or not (a[1] == b[1]).all():
        return {}
    first, tokens = a[0], a[1]
    docs = documents_of(record, first)
    band = np.array([bands_lib.band_of(int(p), train_length) for p in first])
    out = {}
    edges = bands_lib.band_edges(int(record["eval_length"]), train_length)
    for label, keep in [("all", np.ones(len(first), bool))] + [
            (bands_lib.band_label(lo, hi, train_length), band == i) for i, (lo, hi) in enumerate(edges)]:
        if keep.any() and len(set(docs[keep].tolist())) > 1:
            out[label] = (bootstrap.per_cluster(a[2][keep], b[2][keep], tokens[keep], docs[keep]),
                          bootstrap.paired_bootstrap(a[2][keep], b[2][keep], tokens[keep], clusters=docs[keep]))
    return out


def _document_rows(label: str, length: int, by_method: dict[str, dict], ref: str, ref_label: str,
                   train_length: int) -> list[str]:
    """The comparison with `ref` by document: each document's difference and the interval over documents."""
    rows = []
    for name in _order(by_method):
        if name == ref or by_method[name].get("same_as"):
            continue
        documents = by_document(by_method[name], by_method[ref], train_length)
        for band, (each, diff) in documents.items():
            if band == "all" and len(documents) > 2:
                continue  # the bands say it
            cells = ", ".join(f"{100 * (np.exp(d) - 1):+.1f}" for d in each)
            text = bootstrap.percent(diff)
            rows.append(f"| {name} | {band} | {cells} | {f'**{text}**' if diff.certain else text} |")
    if not rows:
        return []
    return ["", f"{label}, L_valid = {length:,}: against {ref_label}, document by document (per cent), and the "
                f"95% interval resampling documents (their blocks kept together; with few documents, wide):", "",
            "| method | band | each document | over documents [95%] |", "|---|---|---|---:|"] + rows


def compare(record: dict, reference: dict, train_length: int) -> dict[str, bootstrap.Difference]:
    """{band label or 'all': the paired bootstrap of record's loss against reference's} over their
    blocks (each block in the band of its first token); {} where they hold no blocks or other tokens."""
    a, b = _blocks(record), _blocks(reference)
    if a is None or b is None or len(a[1]) != len(b[1]) or not (a[1] == b[1]).all():
        return {}
    first, tokens = a[0], a[1]
    out = {"all": bootstrap.paired_bootstrap(a[2], b[2], tokens)}
    edges = bands_lib.band_edges(int(record["eval_length"]), train_length)
    band = np.array([bands_lib.band_of(int(p), train_length) for p in first])
    for i, (low, high) in enumerate(edges):
        if (band == i).any():
            out[bands_lib.band_label(low, high, train_length)] = bootstrap.paired_bootstrap(
                a[2][band == i], b[2][band == i], tokens[band == i])
    return out


def _band_columns(length: int, train_length: int) -> list[tuple[str, str]]:
    """[(band label, heading with its positions)]."""
    return [(bands_lib.band_label(lo, hi, train_length), f"{bands_lib.band_label(lo, hi, train_length)} ({lo:,}-{hi:,})")
            for lo, hi in bands_lib.band_edges(length, train_length)]


def _cell(difference: bootstrap.Difference | None, same: bool) -> str:
    if same:
        return "= (one evaluation)"
    if difference is None:
        return ""
    text = bootstrap.percent(difference)
    return f"**{text}**" if difference.certain else text


def length_tables(label: str, length: int, by_method: dict[str, dict], train_length: int, token: str) -> list[str]:
    """The markdown of one length: perplexity by band, then each method against each reference."""
    columns = _band_columns(length, train_length)
    lines = [f"#### {label}: L_valid = {length:,} (L = {train_length:,}), perplexity per {token} by position band", "",
             "| method | all | " + " | ".join(h for _, h in columns) + " |", "|---|" + "---:|" * (len(columns) + 1)]
    for name in _order(by_method):
        r = by_method[name]
        per_band = {bands_lib.band_label(lo, hi, train_length): loss for lo, hi, _, loss in r["band_nll"]}
        cells = [f"{np.exp(per_band[b]):.2f}" if b in per_band else "" for b, _ in columns]
        lines.append(f"| {name}{'*' if r.get('same_as') else ''} | {r['ppl']:.2f} | " + " | ".join(cells) + " |")
    tokens = sorted({int(r["tokens"]) for r in by_method.values()})
    lines += ["", f"{token.capitalize()}s per method: {', '.join(f'{t:,}' for t in tokens)}; per band: "
              + ", ".join(f"{b} {n:,}" for b, n in _band_tokens(next(iter(by_method.values())), train_length)) + "."]
    for ref, ref_label in REFERENCES:
        if ref not in by_method:
            continue
        rows = []
        for name in _order(by_method):
            if name == ref:
                continue
            r = by_method[name]
            same = bool(r.get("same_as") or by_method[ref].get("same_as")) and r.get("nll") == by_method[ref].get("nll")
            diffs = compare(r, by_method[ref], train_length)
            if diffs or same:
                rows.append(f"| {name} | {_cell(diffs.get('all'), same)} | "
                            + " | ".join(_cell(diffs.get(b), same) for b, _ in columns) + " |")
        if rows:
            lines += ["", f"{label}, L_valid = {length:,}: perplexity against {ref_label} on the same tokens "
                          f"(per cent, 95% paired-bootstrap interval over blocks of "
                          f"{by_method[ref].get('block_size', bands_lib.BLOCK)} tokens):", "",
                      "| method | all | " + " | ".join(h for _, h in columns) + " |",
                      "|---|" + "---:|" * (len(columns) + 1)] + rows
            lines += _document_rows(label, length, by_method, ref, ref_label, train_length)
    return lines


def _band_tokens(record: dict, train_length: int) -> list[tuple[str, int]]:
    return [(bands_lib.band_label(lo, hi, train_length), int(n)) for lo, hi, n, _ in record["band_nll"]]


def table(runs: list[dict]) -> str:
    """Markdown of every run's band tables ('' where no record holds bands)."""
    blocks = []
    for run in runs:
        for (unit, split, kind, max_tokens, step), by_length in groups(run).items():
            what = records.series_label((split, kind, max_tokens, "{}"))
            text = TEXTS.get(split, f"the {split} split")
            head = (f"### {run['label']}: {unit_names(unit)[0]}-level perplexity by position band, {text}, {what}"
                    + (f", step {step}" if step is not None else ""))
            lines = [head, ""]
            for length, by_method in by_length.items():
                lines += length_tables(run["label"], length, by_method, int(run["train_length"]),
                                       unit_names(unit)[1]) + [""]
            blocks.append("\n".join(lines))
    if not blocks:
        return ""
    note = ("Bands: positions inside the evaluation window, before the window L the model was trained at, L-2L, "
            "2L-4L, ...; a token at position p had p tokens of context. *: the method sets nothing at this length "
            "(the model as trained, scored once). In the comparisons, a method's perplexity over the reference's on "
            "the same blocks, in bold where the 95% interval leaves out 0 (blocks resampled as independent: the "
            "intervals are if anything too narrow); '= (one evaluation)': both are the same evaluation.")
    return "\n".join(blocks) + "\n" + note + "\n"


def write(runs: list[dict], out: pathlib.Path) -> dict:
    """OUT/ppl_by_band.md where any record holds bands; {} otherwise."""
    text = table(runs)
    if not text:
        return {}
    files.write_atomically(out / "ppl_by_band.md", "# Perplexity by position band\n\n" + text)
    return {"bands_md": str(out / "ppl_by_band.md")}
