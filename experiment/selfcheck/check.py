"""The first command to run on a new machine (CPU, GPU or TPU): `python selfcheck.py` (selfcheck.py).

For each scheme of the plan, each length and each attention path (every row of models/attention/
paths.py: dense, triangular, blockwise, fused, pallas), on this machine's first device and in the
plan's dtype:
  - the forward and gradient error of the attention function against a float32 dense reference
    (chunked over queries so that it fits at 16k tokens and beyond; the highest matmul precision):
    max |x - reference| / max |reference| for the output, and the largest such error over dQ, dK,
    dV and the scheme's learned parameters for the gradient, on one sequence of random q, k, v;
  - a training step's and an evaluation's tokens/s of a small decoder using that path
    (`model.attention=<path>`, AdamW, `step_tokens` tokens per step), and the bytes XLA plans for
    each compiled program (arguments + outputs + temporaries: the peak it holds);
  - which path `auto` picks at that length, for training and evaluation, and with attention dropout.
A path whose row refuses the scheme is marked n/a; a program planned above the memory limit is
skipped, and so is Pallas' interpreter (off GPU) beyond `interpreter_max_length`; where the kernel
is compiled (GPU), its device check (models/attention/verify.py) runs first and a kernel that fails
it is marked refused, as the framework refuses it. An error above its bound is WRONG (`judge`: the
device check's rule, relative to XLA's own paths at that length), and any WRONG row makes the exit
status 1: a path the framework would use (explicitly or as `auto`'s pick) computes something else on
this machine; else a refused kernel makes it 3 (the summary names each, with why: the framework
runs XLA's paths instead); else a run that checked no row at all (every one skipped, n/a or not run:
a memory limit too small, say) makes it 4; else 0.

The plan is plan.py's (`make_plan`, from selfcheck.py's flags), one cell is measure.py's (`rows_for`),
the table table.py's; this module runs the cells in order within the time budget and writes them.

Writes selfcheck_<device>.json (every number) and .md (the table) in the output folder, after every
(scheme, length) as it goes (`complete` false until the end), so that a crash keeps what was measured.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import time

import jax

from experiment.selfcheck import measure
from experiment.selfcheck.plan import LENGTHS, MEMORY_GB, MINUTES, Plan, make_plan
from experiment.selfcheck.table import markdown, one_line, slug
from experiment.store.files import write_atomically
from models.attention import verify

__all__ = ["LENGTHS", "MEMORY_GB", "MINUTES", "Plan", "make_plan", "run", "summary"]


# ---- the whole run ------------------------------------------------------------------------------------

def write(result: dict, stem: pathlib.Path) -> None:
    """The JSON and markdown files of `result` (as far as it goes), each written aside and renamed."""
    write_atomically(stem.with_suffix(".json"), json.dumps(result, indent=1))
    write_atomically(stem.with_suffix(".md"), markdown(result))


def summary(rows: list[dict]) -> tuple[str, int]:
    """(the closing lines, the exit status): 1 where a path the framework would use is WRONG, else 3
    where a kernel was refused on this device (named, with why: the run uses XLA's paths instead),
    else 4 where no row was checked at all (every one skipped, n/a or not run: a self-check that
    checked nothing does not pass), else 0."""
    wrong = [r for r in rows if r["status"] == "WRONG"]
    refused = [r for r in rows if r["status"] == "refused"]
    checked = [r for r in rows if "forward_error" in r]
    lines = ["every path the framework would use is within tolerance" if not wrong else
             f"{len(wrong)} WRONG row(s): " + "; ".join(f"{r['scheme']} L={r['length']} {r['path']}" for r in wrong)]
    if not checked:
        lines = [f"nothing was checked: all {len(rows)} row(s) skipped, n/a or not run (see their notes; "
                 f"--memory_gb, --minutes and --lengths decide what fits)"]
    reasons: dict[str, list[str]] = {}
    for r in refused:
        reasons.setdefault(r["note"].removeprefix("refused: "), []).append(f"{r['scheme']} L={r['length']} {r['path']}")
    lines += [f"refused here (XLA's paths used instead): {', '.join(where)}: {why}" for why, where in reasons.items()]
    left = sorted({(r["scheme"], r["length"]) for r in rows if r["status"] == "not run"}, key=lambda c: (c[1], c[0]))
    if left:
        lines.append("not run within --minutes (--minutes=0 runs every cell): "
                     + ", ".join(f"{scheme} L={length}" for scheme, length in left))
    return "\n".join(lines), 1 if wrong else 3 if refused else 4 if not checked else 0


def earlier_seconds(stem: pathlib.Path, plan: Plan) -> dict:
    """{(scheme, length): seconds} of an earlier run on this device with the same model, dtype and
    step (its JSON in the output folder), for the estimate before the first cell; {} if there is none."""
    try:
        earlier = json.loads(stem.with_suffix(".json").read_text())
        same = all(earlier["plan"][k] == v for k, v in dataclasses.asdict(plan).items()
                   if k in ("model", "dtype", "step_tokens", "repeats", "timed_max_length", "mode"))
        return {(c["scheme"], c["length"]): c["seconds"] for c in earlier.get("cell_seconds", [])} if same else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def cell_seconds(cell: tuple[str, int], timings: list[dict], earlier: dict) -> float:
    """The expected seconds of a cell: an earlier run's time for it; else the mean of the cells done at
    its length; else the longest length done scaled by (length / that length)^2 (the reference and
    the dense paths grow so); else 0 (nothing to go by)."""
    if cell in earlier:
        return earlier[cell]
    same = [t["seconds"] for t in timings if t["length"] == cell[1]]
    if same:
        return sum(same) / len(same)
    if not timings:
        return 0.0
    longest = max(t["length"] for t in timings)
    at_longest = [t["seconds"] for t in timings if t["length"] == longest]
    return sum(at_longest) / len(at_longest) * (cell[1] / longest) ** 2


def estimate_text(cells: list, earlier: dict, minutes: float) -> str:
    """The line before the first cell: the estimate from an earlier run here, or why there is none,
    and the budget."""
    budget = (f"no cell is started that would end past --minutes={minutes:g} (those left are named; "
              f"--minutes=0 runs every cell)" if minutes else "every cell is run (--minutes=0)")
    known = [earlier[c] for c in cells if c in earlier]
    if len(known) == len(cells):
        guess = f"about {sum(known) / 60:.0f} min by an earlier run on this device"
    elif known:
        guess = f"{len(known)} of them took {sum(known) / 60:.0f} min in an earlier run here, the others unknown"
    else:
        guess = "no earlier run here to estimate from: the time left is printed after each cell"
    return f"{guess}; {budget}"


def not_run(scheme_name: str, length: int, minutes: float) -> list[dict]:
    """The rows of a cell the time budget leaves out, one per path."""
    return [{"scheme": scheme_name, "length": length, "path": path, "auto": "", "status": "not run",
             "note": f"past the time budget (--minutes={minutes:g}; --minutes=0 runs every cell)"}
            for path in measure.measured_paths()]


def run(plan: Plan, out_dir: str | pathlib.Path, say=print) -> tuple[dict, int]:
    """Measure every row, writing the JSON and markdown files after each (scheme, length) (a crash
    keeps what was measured; `complete` says whether the run ended), and return (the result, the exit
    status: `summary`'s)."""
    started, rows, timings = time.time(), [], []
    device = jax.devices()[0]
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"selfcheck_{slug(device.device_kind)}{'_short' if plan.mode == 'short' else ''}"

    def result(complete: bool) -> dict:
        wrong = [r for r in rows if r["status"] == "WRONG"]
        checked = sum("forward_error" in r for r in rows)
        return {"device": device.device_kind, "backend": jax.default_backend(), "devices": jax.device_count(),
                "jax": jax.__version__, "date": datetime.date.today().isoformat(), "seconds": time.time() - started,
                "plan": dataclasses.asdict(plan), "floor": verify.FLOOR[plan.dtype], "cap": verify.CAP[plan.dtype],
                "xla_factor": verify.XLA_FACTOR, "complete": complete, "cell_seconds": timings,
                "rows": rows, "wrong": len(wrong), "refused": sum(r["status"] == "refused" for r in rows),
                "checked": checked, "passed": not wrong and checked > 0}
    # shortest lengths first, so that what the budget leaves out is the longest cells
    cells = [(scheme_name, length) for length in sorted(plan.lengths) for scheme_name in plan.schemes]
    earlier = earlier_seconds(stem, plan)
    say(f"{len(cells)} (scheme, length) cells x {len(measure.measured_paths())} paths, shortest first; "
        + estimate_text(cells, earlier, plan.minutes))
    for done, (scheme_name, length) in enumerate(cells, 1):
        begun = time.time()
        for row in measure.rows_for(plan, scheme_name, length):
            rows.append(row)
            say(one_line(row))
        timings.append({"scheme": scheme_name, "length": length, "seconds": time.time() - begun})
        write(result(False), stem)
        if done == len(cells):
            break
        spent, rest = time.time() - started, cells[done:]
        upcoming = cell_seconds(rest[0], timings, earlier)
        if plan.minutes and spent + upcoming > plan.minutes * 60:
            for scheme_name, length in rest:
                rows.extend(not_run(scheme_name, length, plan.minutes))
            say(f"{done}/{len(cells)} cells in {spent / 60:.1f} min; the next ({rest[0][0]} at {rest[0][1]:,}) "
                f"would take about {upcoming / 60:.1f} min more, past --minutes={plan.minutes:g}: {len(rest)} "
                f"cell(s) not run (--minutes=0 runs every cell)")
            break
        left = sum(cell_seconds(cell, timings, earlier) for cell in rest)
        say(f"{done}/{len(cells)} cells in {spent / 60:.1f} min; about {left / 60:.0f} min left")
    final = result(True)
    write(final, stem)
    lines, status = summary(rows)
    say(f"wrote {stem}.json and {stem}.md: {lines}")
    return final, status
