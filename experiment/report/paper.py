"""Published numbers of Press, Smith & Lewis (ICLR 2022), shipped as data (data/press2022_*.csv).

WikiText-103 validation perplexity of their 247M-parameter word-level model, nonoverlapping
(Tables 2-5) and sliding window with stride 1 (Tables 13-15); `OOM` cells are left out.
"""
from __future__ import annotations

import csv
import functools
import pathlib

DATA = pathlib.Path(__file__).parent / "data" / "press2022_wikitext103_valid.csv"
# our registry names -> the paper's
PAPER_SCHEME = {"sinusoidal": "sinusoidal", "rope": "rotary", "t5": "t5", "alibi": "alibi"}
CITATION = "Press et al. 2022"


@functools.lru_cache(maxsize=1)
def rows() -> tuple[dict, ...]:
    out, seen = [], set()
    with open(DATA, newline="") as f:
        for r in csv.DictReader(f):
            if r["ppl"] == "OOM":
                continue
            key = (int(r["train_length"]), int(r["eval_length"]), r["scheme"], int(r["stride"]))
            if key in seen:  # Table 5 repeats some cells of Tables 2-4
                continue
            seen.add(key)
            out.append({"train_length": key[0], "eval_length": key[1], "scheme": key[2],
                        "stride": key[3], "ppl": float(r["ppl"]), "source": r["source"]})
    return tuple(out)


def curve(scheme: str, train_length: int, sliding: bool) -> list[tuple[int, float]]:
    """[(eval_length, ppl)] of the paper for our scheme name at this training length; sliding means
    stride 1 (Tables 13-15), otherwise nonoverlapping. Empty when the paper has no such row."""
    name = PAPER_SCHEME.get(scheme)
    if name is None:
        return []
    pts = [(r["eval_length"], r["ppl"]) for r in rows()
           if r["scheme"] == name and r["train_length"] == train_length
           and (r["stride"] == 1 if sliding else r["stride"] == r["eval_length"])]
    return sorted(pts)
