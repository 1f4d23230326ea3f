"""The rows of the table of every scheme (experiment/report/schemes.py), read: the manifest a table
root holds (ROOT/rows.json, written by experiment/pipeline/table.py), its times (ROOT/timings.json),
each row's numbers from its runs' records (every seed's folder, RUN_seed<N> beside RUN), their ranks
with ties, and the rows an earlier table keeps (`--keep`). Nothing here draws or writes."""
from __future__ import annotations

import json
import pathlib
import re

from experiment.report.seeds import overlap, spread, wilson
from experiment.store import records
from experiment.store.files import first_line
from experiment.store.run import RunDir, RunError

MANIFEST = "rows.json"
TIMINGS = "timings.json"
NOT_YET = "not evaluated yet"


def read_manifest(root: str | pathlib.Path) -> dict:
    """ROOT/rows.json, checked: a missing or damaged one is a one-line error naming it and the
    command that writes it."""
    path = pathlib.Path(root) / MANIFEST
    again = f"python sweep.py --config configs/all_schemes.py --table --workdir {root}"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: a table root is made by {again}")
    try:
        manifest = json.loads(path.read_text())
        problem = None if isinstance(manifest, dict) and isinstance(manifest.get("rows"), list) else (
            "expected an object with a list of rows")
    except (ValueError, OSError) as e:
        problem = first_line(e)
    if problem:
        raise RunError(f"{path} is damaged ({problem}); the table's command writes it again from its runs (those "
                       f"done are skipped): {again}")
    return manifest


def read_timings(root: pathlib.Path) -> dict:
    """ROOT/timings.json ({} if there is none); damaged: a one-line error naming it."""
    path = root / TIMINGS
    if not path.exists():
        return {}
    try:
        timings = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        timings = first_line(e)
    if not isinstance(timings, dict):
        raise RunError(f"{path} is damaged ({timings if isinstance(timings, str) else 'not an object'}); it holds "
                       f"only the table's times: delete it (rm {path}) and the table is written without them")
    return timings


def _overrides_json(overrides: dict) -> str:
    return json.dumps(overrides or {}, sort_keys=True)


def _perplexities(recs: list[dict], row: dict, protocol: dict) -> dict[int, dict]:
    """{length: the record of this row's overrides at that length} (nonoverlapping, the protocol's split
    and token count)."""
    out = {}
    for length in protocol["lengths"]:
        wanted = records.record_key({"split": protocol["split"], "eval_length": length, "stride": length,
                                     "max_tokens": protocol.get("max_tokens", 0),
                                     "overrides": row["overrides"].get(str(length), {})})
        found = [r for r in recs if records.record_key(r) == wanted]
        if found:
            out[length] = found[0]
    return out


def _passkey_counts(recs: list[dict], row: dict, protocol: dict) -> dict[int, tuple[float, int]]:
    """{length: (keys retrieved, keys asked) over every depth}, where every depth is there."""
    out = {}
    depths = {float(d) for d in protocol["passkey"]["depths"]}
    for length in protocol["lengths"]:
        wanted = _overrides_json(row["overrides"].get(str(length), {}))
        cell = [r for r in recs if int(r["eval_length"]) == length and _overrides_json(r.get("overrides")) == wanted
                and int(r.get("digits", 4)) == protocol["passkey"]["digits"]]
        if cell and {float(r["depth"]) for r in cell} >= depths:
            out[length] = (sum(r["accuracy"] * r["count"] for r in cell), sum(r["count"] for r in cell))
    return out


def seed_runs(root: pathlib.Path, run: str) -> list[str]:
    """The folders of a row's run: RUN, then RUN_seed<N> (experiment/pipeline/run.py: seed_name) by N."""
    pattern = re.compile(rf"{re.escape(run)}_seed(\d+)")
    found = [(int(m.group(1)), p.name) for p in (root.iterdir() if root.is_dir() else [])
             if p.is_dir() and (m := pattern.fullmatch(p.name))]
    return [run] + [name for _, name in sorted(found)]


def _row_numbers(seeds: list[tuple[list[dict], list[dict]]], row: dict, protocol: dict) -> dict:
    """A row's cells from the records of each of its seeds: ppl (the mean), ppl_spread where a length
    has several seeds, passkey (pooled over every key of every seed), passkey_interval (its 95% Wilson
    interval) where several seeds have it, and the checkpoint steps."""
    found = [_perplexities(ppl_recs, row, protocol) for ppl_recs, _ in seeds]
    values = {n: [f[n]["ppl"] for f in found if n in f] for n in protocol["lengths"]}
    spreads = {n: spread(v) for n, v in values.items() if v}
    counts = [_passkey_counts(passkey_recs, row, protocol) for _, passkey_recs in seeds]
    pooled = {n: (sum(c[n][0] for c in counts if n in c), sum(c[n][1] for c in counts if n in c),
                  sum(n in c for c in counts)) for n in protocol["lengths"] if any(n in c for c in counts)}
    out = {"ppl": {n: s["mean"] for n, s in spreads.items()},
           "passkey": {n: hits / asked for n, (hits, asked, _) in pooled.items()},
           "step": sorted({int(r["step"]) for f in found for r in f.values() if "step" in r})}
    if len(seeds) > 1:
        out["ppl_spread"] = {n: s for n, s in spreads.items() if s["n"] > 1}
        out["passkey_interval"] = {n: wilson(hits, asked) for n, (hits, asked, k) in pooled.items() if k > 1}
    return out


def read_kept(path: str | pathlib.Path, protocol: dict) -> dict:
    """An earlier table's numbers (its all_schemes.json) for `keep`: {row name: row}, checked to have
    been measured under `protocol` (the same training and evaluation); otherwise a one-line error."""
    try:
        earlier = json.loads(pathlib.Path(path).read_text())
        rows, theirs = earlier["rows"], earlier["protocol"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--keep {path}: not a table's all_schemes.json ({first_line(e)})") from None
    differ = sorted(k for k in set(protocol) | set(theirs) if protocol.get(k) != theirs.get(k))
    if differ:
        raise ValueError(f"--keep {path} was measured under another protocol ({', '.join(differ)} differ): its rows "
                         f"cannot stand beside these; re-run them instead (drop --keep)")
    return {"rows": {r["name"]: r for r in rows}, "timings": earlier.get("timings", {}), "path": str(path)}


def _kept_row(row: dict, kept: dict, lengths: list[int]) -> dict:
    """A manifest row with the numbers of its row in an earlier table (JSON keys back to lengths)."""
    by_length = {field: {int(k): v for k, v in kept.get(field, {}).items()}
                 for field in ("ppl", "ratio", "passkey", "ppl_spread", "passkey_interval")}
    missing = {int(k): why for k, why in kept.get("missing", {}).items()}
    return {**row, **{k: v for k, v in by_length.items() if v or k in ("ppl", "ratio", "passkey")},
            "step": kept.get("step", []), "kept": True,
            **({"seed_runs": kept["seed_runs"]} if "seed_runs" in kept else {}),
            "missing": {n: missing.get(n, row.get("cannot", {}).get(str(n), NOT_YET)) for n in lengths}}


def collect(root: str | pathlib.Path, keep: dict | None = None) -> dict:
    """{protocol, rows}: each manifest row with `ppl`, `ratio` (to its own perplexity at L), `passkey`
    ({length: value}), `missing` ({length: why}) and `step`, sorted by perplexity at the longest
    length (rows without one last, by name), then ranked. `keep` (read_kept: an earlier table's rows):
    a row whose run has no folder under ROOT takes its numbers from there (marked `kept`)."""
    root = pathlib.Path(root)
    manifest = read_manifest(root)
    protocol, lengths = manifest["protocol"], manifest["protocol"]["lengths"]
    cache: dict[str, tuple[list[dict], list[dict]]] = {}
    rows = []
    for row in manifest["rows"]:
        if keep and row["name"] in keep["rows"] and not (root / row["run"]).is_dir():
            rows.append(_kept_row(row, keep["rows"][row["name"]], lengths))
            continue
        folders = seed_runs(root, row["run"])
        for folder in folders:
            if folder not in cache:
                run = RunDir(root / folder)
                cache[folder] = (run.records("perplexity"), run.records("passkey"))
        numbers = _row_numbers([cache[folder] for folder in folders], row, protocol)
        first = numbers["ppl"].get(lengths[0])
        missing = {length: row.get("cannot", {}).get(str(length), NOT_YET) for length in lengths}
        rows.append({**row, **numbers, "missing": missing, **({"seed_runs": folders} if len(folders) > 1 else {}),
                     "ratio": {length: p / first for length, p in numbers["ppl"].items()} if first else {}})
    last = lengths[-1]
    rows.sort(key=lambda r: (last not in r["ppl"], r["ppl"].get(last, 0.0), r["name"]))
    rank_with_ties(rows, last)
    return {"protocol": protocol, "rows": rows, **({"kept_from": keep["path"]} if keep else {})}


def rank_with_ties(rows: list[dict], length: int) -> None:
    """Each row's `rank` (rows sorted by mean perplexity at `length`, those without one last): one plus
    the rows before it that it does not tie with. Two rows tie where one has several seeds and their
    intervals, mean ± std, overlap (a row of one seed: its value); `tied` says whether it shares its rank."""
    def interval(row):
        s = row.get("ppl_spread", {}).get(length)
        value = row["ppl"].get(length)
        return (s["mean"] - s["std"], s["mean"] + s["std"]) if s else (value, value)

    def ties(a, b):
        return (length in a["ppl"] and length in b["ppl"] and (length in a.get("ppl_spread", {})
                                                                or length in b.get("ppl_spread", {}))
                and overlap(interval(a), interval(b)))
    for i, row in enumerate(rows):
        row["rank"] = 1 + sum(not ties(row, before) for before in rows[:i])
    for row in rows:
        row["tied"] = sum(other["rank"] == row["rank"] for other in rows) > 1
