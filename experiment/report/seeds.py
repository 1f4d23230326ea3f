"""Runs that differ only in their seed (sweep.py --seeds; compared by their resolved configs without
`seed`), reported as one: its perplexity the mean over the seeds with their spread, its passkey
accuracy pooled over every key of every seed with a 95% Wilson interval. A run without such
siblings is reported as it is.

The numbers here are what the reports print: `spread` (mean, sample standard deviation, min, max,
n), `wilson` (the score interval of a binomial proportion), `overlap` (two intervals share a point).
"""
from __future__ import annotations

import json
import math
import re
from collections import defaultdict

from experiment.store import records as record_kinds

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: a two-sided 95% interval
SEED_SUFFIX = re.compile(r"_seed\d+$")  # experiment/pipeline/run.py: seed_name


def config_key(config: dict) -> str:
    """What runs of one config share: the resolved config (as config.json holds it) without `seed`."""
    return json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True, default=list)


def spread(values: list[float]) -> dict:
    """{mean, std (sample standard deviation; 0 for one value), min, max, n} of `values`."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": n}


def wilson(hits: float, count: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion hits / count (95% by default): (low, high) within
    [0, 1], never empty at 0 or 1 hits as the normal approximation is."""
    if count <= 0:
        return 0.0, 1.0
    p = hits / count
    denominator = 1 + z * z / count
    centre = (p + z * z / (2 * count)) / denominator
    half = z * math.sqrt(p * (1 - p) / count + z * z / (4 * count * count)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether intervals a and b (low, high) share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


def groups(runs: list[dict]) -> list[list[dict]]:
    """The runs in sets that differ only in their seed (`config_key`), in the order of each set's
    first run. A run without a key, and runs of one config that repeat a seed (the same run twice,
    in two folders: compared, not pooled), stand alone."""
    by_key: dict[str, list[dict]] = defaultdict(list)
    for i, run in enumerate(runs):
        by_key[run.get("config_key") or f"#{i}"].append(run)
    out, seen = [], set()
    for i, run in enumerate(runs):
        key = run.get("config_key") or f"#{i}"
        found = by_key[key]
        if len({r.get("seed") for r in found}) < len(found):
            out.append([run])
        elif key not in seen:
            seen.add(key)
            out.append(found)
    return out


def mark_members(runs: list[dict]) -> None:
    """Runs that share their config with another (several seeds of one config) get ', seed N' in
    their label, and their label without it as `group_label`."""
    for members in groups(runs):
        if len(members) > 1:
            for run in members:
                run["group_label"] = run["label"]
                run["label"] += f", seed {run['seed']}"


def members(run: dict) -> list[dict]:
    """The runs a reported run stands for: its seeds, or itself."""
    return run.get("members", [run])


def _mean_record(recs: list[dict]) -> dict:
    """One perplexity record of a set of seeds: the first one's fields, ppl (and word_ppl, nll,
    the loss by position where the bins agree) the mean, `ppl_spread` (`word_ppl_spread`) beside it."""
    out = dict(recs[0])
    for field in ("ppl", "word_ppl"):
        values = [r[field] for r in recs if field in r]
        if len(values) == len(recs):
            out[f"{field}_spread"] = spread(values)
            out[field] = out[f"{field}_spread"]["mean"]
    if all("nll" in r for r in recs):
        out["nll"] = sum(r["nll"] for r in recs) / len(recs)
    bins = [[(a, b) for a, b, _ in r.get("position_nll") or []] for r in recs]
    if bins[0] and all(b == bins[0] for b in bins):
        out["position_nll"] = [[a, b, sum(r["position_nll"][i][2] for r in recs) / len(recs)]
                               for i, (a, b) in enumerate(bins[0])]
    if not all(r.get("same_as") for r in recs):
        out.pop("same_as", None)
    return out


def mean_records(member_runs: list[dict]) -> list[dict]:
    """The perplexity records of a set of seeds: one per (unit, record, checkpoint step) any seed has,
    over the seeds that have it (`ppl_spread.n`)."""
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for run in member_runs:
        for r in run["records"]:
            by_key[(r["tokenizer"], record_kinds.record_key(r), r.get("step"))].append(r)
    return [_mean_record(recs) for recs in by_key.values()]


def combine(member_runs: list[dict]) -> dict:
    """One reported run of several seeds: the first seed's description, labelled 'LABEL, N seeds',
    named by the common part of the folders' names, its `records` the means (`mean_records`), and
    its `members`."""
    first = member_runs[0]
    return {**first, "label": f"{first.get('group_label', first['label'])}, {len(member_runs)} seeds",
            "name": SEED_SUFFIX.sub("", first["name"]), "file": SEED_SUFFIX.sub("", first["file"]),
            "seeds": [run["seed"] for run in member_runs], "members": member_runs,
            "workdirs": [run["workdir"] for run in member_runs], "records": mean_records(member_runs)}


def grouped(runs: list[dict]) -> list[dict]:
    """The runs as reported: each set of seeds one run (`combine`), a run without siblings itself."""
    return [found[0] if len(found) == 1 else combine(found) for found in groups(runs)]
