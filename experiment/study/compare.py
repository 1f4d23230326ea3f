"""One comparison of re-run records with committed ones (study.py --check): each new record is matched
with the committed record of the same key (experiment/store/records.py: what identifies a record of its
kind) and the same number of examples, and its measure compared: perplexity relatively, passkey
accuracy and RULER's score absolutely. A new record with no committed match fails the check."""
from __future__ import annotations

import json
import pathlib

from experiment.store.records import KINDS

MEASURES = {"perplexity": ("ppl", True), "passkey": ("accuracy", False), "ruler": ("score", False),
            "attention": ("mean_distance", False)}  # kind -> (field, relative)


def _label(kind: str, record: dict) -> str:
    parts = [kind, record.get("method") or "as trained", record.get("task", ""), f"L={record['eval_length']}"]
    return " ".join(p for p in parts if p)


def compare_records(committed_folder: pathlib.Path, new: dict[str, list[dict]],
                    tolerance: float = 0.0) -> tuple[str, bool]:
    """(a summary, whether every new record is within `tolerance` of its committed match)."""
    lines, worst, missing = [], 0.0, []
    for kind, records in new.items():
        path = committed_folder / KINDS[kind].file
        old = json.loads(path.read_text()) if path.exists() else []
        field, relative = MEASURES[kind]
        by_key = {(KINDS[kind].key(r), r.get("count")): r for r in old}
        for r in records:
            match = by_key.get((KINDS[kind].key(r), r.get("count")))
            if match is None:
                missing.append(_label(kind, r))
                continue
            a, b = float(r[field]), float(match[field])
            diff = abs(a - b) / abs(b) if relative and b else abs(a - b)
            worst = max(worst, diff)
            lines.append(f"{_label(kind, r)}: {field} {a:.6g} (committed {b:.6g})")
    return _summary(lines, worst, missing, "not in the committed records", tolerance)


def _summary(lines: list[str], worst: float, missing: list[str], missing_label: str,
             tolerance: float) -> tuple[str, bool]:
    """(the compared lines, what is missing and the verdict, as text; whether it is the same)."""
    same = bool(lines) and not missing and worst <= tolerance
    lines = lines + ([f"{missing_label}: {', '.join(missing)}"] if missing else [])
    lines.append(f"largest difference: {worst:.3g} (tolerance {tolerance:g}, relative for perplexity): "
                 f"{'the same' if same else 'DIFFERENT'}")
    return "\n".join(lines), same


def compare_rows(new_table: pathlib.Path, committed_table: pathlib.Path, rows: list[str],
                 tolerance: float = 0.0) -> tuple[str, bool]:
    """(a summary, whether each named row (its run folder's name) of a re-run all_schemes.json is within
    `tolerance` of the committed table's: perplexity relatively, passkey accuracy absolutely, at every
    length both hold)."""
    new, old = (({r["run"]: r for r in json.loads(pathlib.Path(p).read_text())["rows"]})
                for p in (new_table, committed_table))
    lines, worst, missing = [], 0.0, [name for name in rows if name not in new or name not in old]
    for name in (n for n in rows if n not in missing):
        for field, relative in (("ppl", True), ("passkey", False)):
            for length, b in old[name].get(field, {}).items():
                a = new[name].get(field, {}).get(length)
                if a is None or b is None:
                    continue
                diff = abs(a - b) / abs(b) if relative and b else abs(a - b)
                worst = max(worst, diff)
                lines.append(f"{name} {field} L={length}: {a:.6g} (committed {b:.6g})")
    return _summary(lines, worst, missing, "rows in only one table", tolerance)


def main(argv: list[str] | None = None) -> int:
    """python -m experiment.study.compare records RUN COMMITTED_FOLDER [--kinds perplexity,passkey] | rows
    NEW.json COMMITTED.json --rows a,b: the check steps of the studies that train (exit 1 where different)."""
    import argparse
    from experiment.store.run import RunDir
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    records = sub.add_parser("records", help="a run's records against a folder of committed ones")
    records.add_argument("run")
    records.add_argument("committed")
    records.add_argument("--kinds", default="perplexity,passkey")
    rows = sub.add_parser("rows", help="rows of a re-run all_schemes.json against the committed one")
    rows.add_argument("new")
    rows.add_argument("committed")
    rows.add_argument("--rows", required=True)
    for p in (records, rows):
        p.add_argument("--tolerance", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.what == "records":
        run = RunDir(args.run)
        text, same = compare_records(pathlib.Path(args.committed),
                                     {k: run.records(k) for k in args.kinds.split(",")}, args.tolerance)
    else:
        text, same = compare_rows(pathlib.Path(args.new), pathlib.Path(args.committed), args.rows.split(","),
                                  args.tolerance)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
