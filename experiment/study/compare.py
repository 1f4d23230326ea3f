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
    same = bool(lines) and not missing and worst <= tolerance
    lines += [f"not in the committed records: {', '.join(missing)}"] if missing else []
    lines.append(f"largest difference: {worst:.3g} (tolerance {tolerance:g}, relative for perplexity): "
                 f"{'the same' if same else 'DIFFERENT'}")
    return "\n".join(lines), same
