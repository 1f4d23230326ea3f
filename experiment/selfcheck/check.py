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
runs XLA's paths instead); else 0.

Writes selfcheck_<device>.json (every number) and .md (the table) in the output folder, after every
(scheme, length) as it goes (`complete` false until the end), so that a crash keeps what was measured.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from experiment.config import TrainConfig
from experiment.runtime.accelerator import device_memory_limit, program_bytes
from experiment.selfcheck.table import markdown, one_line, slug
from experiment.store.files import write_atomically
from experiment.train.optimizer import make_optimizer
from experiment.train.step import make_train_step
from models import DecoderLM
from models.attention import choice, pallas, paths, verify
from models.attention.dense import dense_attention
from models.config import ModelConfig
from posenc.domains import at_least

PATHS: tuple[str, ...] = ()  # the attention paths measured; empty: every row of models/attention/paths.py
REFERENCE_CHUNK = 512  # queries per chunk of the float32 reference


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run measures. `model`: ModelConfig options of the timed decoder (its heads and head
    dimension also shape the attention inputs); `step_tokens`: tokens per timed step (rows =
    step_tokens // length, at least 1); `memory_limit`: bytes a compiled program may plan."""
    mode: str
    schemes: tuple
    lengths: tuple
    dtype: str
    model: dict
    step_tokens: int
    repeats: int
    interpreter_max_length: int
    timed_max_length: int  # longer sequences: errors only (0: time every length)
    memory_limit: int
    minutes: float = 10.0  # no cell is started that would end past this (0: every cell)

    @property
    def head_dim(self) -> int:
        return self.model["d_model"] // self.model["num_heads"]


LENGTHS = at_least(1)  # selfcheck.py --lengths, each
MEMORY_GB = at_least(0, note="0 = the default: 90% of the device, a quarter of the available memory on CPU")
MINUTES = at_least(0, note="0 = no limit: every cell")


def _lengths(lengths: str | Sequence[int]) -> tuple[int, ...]:
    """--lengths as whole numbers >= 1 (comma-separated text, or a sequence); a ValueError names the flag."""
    items = [x.strip() for x in lengths.split(",") if x.strip()] if isinstance(lengths, str) else list(lengths)
    out = []
    for item in items:
        try:
            value = int(item) if isinstance(item, str) else item
        except ValueError:
            value = None
        if not isinstance(value, int) or isinstance(value, bool) or not LENGTHS.test(value, {}):
            raise ValueError(f"flag --lengths={lengths if isinstance(lengths, str) else ','.join(map(str, lengths))}: "
                             f"{str(item)!r} is not a whole number {LENGTHS.describe({})} (e.g. --lengths=512,4096)")
        out.append(value)
    return tuple(out)


SHAPES = {  # selfcheck.py --shape: the attention heads of the timed decoder, and the lengths measured
    "small": {},  # the full plan's own: 4 heads of 64
    "paper": dict(model=dict(num_layers=2, d_model=1024, num_heads=8, mlp_dim=4096, vocab_size=256),
                  lengths=(512, 4096, 16384)),  # the ALiBi paper's 8 heads of 128, L = 512 and evaluation
}


def make_plan(short: bool = False, schemes: str = "", lengths: str | Sequence[int] = "", dtype: str = "",
              memory_gb: float = 0.0, shape: str = "small", minutes: float = 10.0) -> Plan:
    """The full plan (up to 16k tokens; 16,384 tokens per timed step on an accelerator; on a CPU
    4,096, fewer repeats, and no timing beyond 4,096 tokens, where one training step takes minutes)
    or the short one (tiny, for CI's machine), with any of its lists or settings replaced. A length
    or memory limit outside its domain is a ValueError naming selfcheck.py's flag (a negative
    limit would skip every row and report a pass)."""
    if not MEMORY_GB.test(memory_gb, {}):
        raise ValueError(f"flag --memory_gb={memory_gb:g}: must be {MEMORY_GB.describe({})} (e.g. --memory_gb=8)")
    if not MINUTES.test(minutes, {}):
        raise ValueError(f"flag --minutes={minutes:g}: must be {MINUTES.describe({})} (e.g. --minutes=30)")
    lengths = _lengths(lengths)
    accelerator = jax.default_backend() in ("gpu", "tpu")
    if short:
        base = dict(mode="short", schemes=("alibi", "t5"), lengths=(24, 40), repeats=1, step_tokens=96,
                    interpreter_max_length=64, timed_max_length=0,
                    model=dict(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, vocab_size=64, attention_block=16))
    else:
        base = dict(mode="full", schemes=("alibi", "rope", "t5", "kerple_log", "fire", "logn"),
                    lengths=(512, 1000, 4096, 16384), repeats=3 if accelerator else 2,
                    step_tokens=16384 if accelerator else 4096, interpreter_max_length=1024,
                    timed_max_length=0 if accelerator else 4096,
                    model=dict(num_layers=2, d_model=256, num_heads=4, mlp_dim=1024, vocab_size=256))
    if shape not in SHAPES:
        raise ValueError(f"flag --shape={shape}: one of {', '.join(SHAPES)}")
    if not short:
        base.update(SHAPES[shape])
    return Plan(schemes=tuple(schemes.split(",")) if schemes else base["schemes"],
                lengths=lengths or base["lengths"],
                dtype=dtype or ("bfloat16" if accelerator else "float32"),
                memory_limit=int(memory_gb * 2**30) if memory_gb else default_memory_limit(), minutes=float(minutes),
                **{k: v for k, v in base.items() if k not in ("schemes", "lengths")})


def default_memory_limit() -> int:
    """90% of the device's memory; on CPU a quarter of the memory available now (the machine may be
    shared, and a process takes more than the program XLA plans)."""
    limit = device_memory_limit()
    if limit:
        return int(limit * 0.9)
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    except (OSError, StopIteration):
        available = 8 * 2**30
    return available // 4


class Skipped(Exception):
    """A measurement not taken, with why (too large for the memory limit, interpreted, refused)."""


def admit_within(limit: int):
    def admit(compiled):
        need = program_bytes(compiled)
        if need is not None and need > limit:
            raise Skipped(f"needs {need / 2**30:.1f} GiB (limit {limit / 2**30:.1f})")
    return admit


# ---- attention: errors against the float32 reference ---------------------------------------------

def reference_attention(q, k, v, q_pos, k_pos, scheme):
    """Dense causal attention, one chunk of queries against all keys at a time, in a loop whose
    steps are rematerialised in the backward pass: the same numbers as `dense_attention` in
    O(T x chunk) memory."""
    b, t, h, d = q.shape
    n = -(-t // REFERENCE_CHUNK)
    pad = n * REFERENCE_CHUNK - t  # padded queries (after every real one) are computed, then dropped
    q_chunks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, REFERENCE_CHUNK, h, d).swapaxes(0, 1)
    pos_chunks = jnp.pad(q_pos, ((0, 0), (0, pad)), mode="edge").reshape(b, n, REFERENCE_CHUNK).swapaxes(0, 1)

    @jax.checkpoint
    def chunk(carry, xs):
        i, q_i, q_pos_i = xs
        mask = (i * REFERENCE_CHUNK + jnp.arange(REFERENCE_CHUNK))[:, None] >= jnp.arange(t)[None, :]
        return carry, dense_attention(q_i, k, v, q_pos_i, k_pos, scheme, mask)
    _, out = jax.lax.scan(chunk, None, (jnp.arange(n), q_chunks, pos_chunks))
    return out.swapaxes(0, 1).reshape(b, n * REFERENCE_CHUNK, h, d)[:, :t]


def measured_paths() -> tuple[str, ...]:
    return PATHS or tuple(paths.PATHS)


def xla_paths() -> set[str]:
    """XLA's own code on every backend (the rows marked `xla`)."""
    return {name for name, row in paths.PATHS.items() if row.xla}


def path_function(path: str, plan: Plan, launch=None):
    """The attention function of `path` (its row's `run`), called as `dense_attention` is without its mask."""
    block = plan.model.get("attention_block", ModelConfig.attention_block)
    return lambda q, k, v, qp, kp, s: paths.PATHS[path].run(q, k, v, paths.Call(qp, kp, s, block=block, launch=launch))


def attention_errors(got: dict, reference: dict) -> dict:
    errors = verify.compare(got, reference)
    worst = max((n for n in errors if n != "out"), key=errors.get)
    return {"forward_error": errors["out"], "gradient_error": errors[worst], "worst_gradient": worst}


# ---- models: training and evaluation throughput -------------------------------------------------------

def timed(plan: Plan, scheme_name: str, path: str, length: int, run: bool = True) -> dict:
    """tokens/s of a training step and of an evaluation, and XLA's planned bytes of each, for the
    plan's decoder with `model.attention=path` at `length` (not `run`: the bytes only)."""
    options = {k: v for k, v in plan.model.items() if k != "vocab_size"}
    cfg = ModelConfig(vocab_size=plan.model["vocab_size"], attention=path, dtype=plan.dtype, **options)
    model = DecoderLM(cfg, posenc.default_config(scheme_name), train_length=length, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    rows = max(1, plan.step_tokens // length)
    tokens = jax.random.randint(jax.random.key(0), (rows, length), 0, cfg.vocab_size)
    tx = make_optimizer(TrainConfig())
    train = make_train_step(graphdef, tx, dropout_seed=0)
    score = jax.jit(lambda params, tokens: nnx.merge(graphdef, params).token_nll(tokens, tokens).sum())
    out = {}
    copy = jax.tree.map(jnp.copy, params)  # the training step donates its parameters
    for kind, jitted, args in (("train", train, [copy, tx.init(copy), tokens, tokens, np.int32(0)]),
                               ("eval", score, [params, tokens])):
        compiled = jitted.lower(*args).compile()
        out[f"{kind}_mb"] = (program_bytes(compiled) or 0) / 2**20
        admit_within(plan.memory_limit)(compiled)
        if not run:
            continue
        seconds = []
        for _ in range(plan.repeats + 1):  # the first call warms up
            start = time.perf_counter()
            result = compiled(*args)
            jax.block_until_ready(result)
            seconds.append(time.perf_counter() - start)
            if kind == "train":  # the step donates its parameters and optimizer state
                args = [result[0], result[1], *args[2:]]
        out[f"{kind}_tokens_per_s"] = rows * length / float(np.median(seconds[1:]))
    return out


def auto_picks(plan: Plan, scheme: posenc.Scheme, length: int) -> dict:
    """`auto`'s path for training and evaluation (no attention dropout), and with attention dropout
    (None where no path takes the scheme so: stick-breaking with attention dropout)."""
    options = {k: v for k, v in plan.model.items() if k != "vocab_size"}
    cfg = ModelConfig(vocab_size=plan.model["vocab_size"], attention="auto", dtype=plan.dtype, **options)
    pos = jnp.arange(length, dtype=jnp.int32)[None]
    picks = {}
    for label, dropping in (("train, eval", False), ("attention dropout", True)):
        try:
            picks[label] = choice.choose(cfg, scheme, pos, jnp.dtype(plan.dtype), dropping=dropping)
        except ValueError:
            picks[label] = None
    return picks


# ---- one (scheme, length) ---------------------------------------------------------------------------

def rows_for(plan: Plan, scheme_name: str, length: int) -> list[dict]:
    """One row per attention path: errors, throughput, memory, auto's picks, status."""
    heads = plan.model["num_heads"]
    dims = posenc.ModelDims(d_model=plan.model["d_model"], num_heads=heads, head_dim=plan.head_dim,
                            num_layers=1, train_length=length)
    scheme = posenc.build(posenc.default_config(scheme_name), dims, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, length, heads, plan.head_dim)), plan.dtype) for _ in range(3))
    pos = jnp.arange(length, dtype=jnp.int32)[None]
    cotangent = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    admit = admit_within(plan.memory_limit)
    picks, rows = auto_picks(plan, scheme, length), []
    try:
        with jax.default_matmul_precision("highest"):
            reference = verify.outputs(reference_attention, scheme, *(x.astype(jnp.float32) for x in (q, k, v)),
                                       pos, cotangent, admit)
    except Skipped as e:
        return [{"scheme": scheme_name, "length": length, "path": path, "status": "skipped",
                 "auto": ", ".join(label for label, pick in picks.items() if pick == path),
                 "note": f"the reference {e}"} for path in measured_paths()]
    for path in measured_paths():
        row = {"scheme": scheme_name, "length": length, "path": path,
               "auto": ", ".join(label for label, pick in picks.items() if pick == path), "status": "ok", "note": ""}
        rows.append(row)
        refusal = paths.PATHS[path].accepts(scheme.traits, paths.Shape(scheme_name, length))
        if refusal:
            row.update(status="n/a", note=refusal[:160])
            continue
        try:
            launch, row["note"] = device_guard(plan, path, scheme, length)
            got = verify.outputs(path_function(path, plan, launch), scheme, q, k, v, pos, cotangent, admit)
        except Skipped as e:
            row.update(status="refused" if str(e).startswith("refused") else "skipped", note=str(e))
            continue
        except ValueError as e:  # a shape the path cannot take here (its own message says so)
            row.update(status="n/a", note=str(e).splitlines()[0][:160])
            continue
        row.update(attention_errors(got, reference))
        if row["note"].startswith("refused"):  # ran, but the device check rejects it: never used
            row["status"] = "refused"
        if row["status"] == "refused" or (launch is not None and launch.interpret):
            continue  # not timed: never used / Pallas' interpreter
        run = not plan.timed_max_length or length <= plan.timed_max_length
        if not run:
            row["note"] = f"not timed beyond {plan.timed_max_length:,} tokens here (memory: compiled only)"
        try:
            row.update(timed(plan, scheme_name, path, length, run))
        except Skipped as e:
            row["note"] = "; ".join(x for x in (row["note"], f"not timed: {e}") if x)
    judge(rows, plan.dtype)
    return rows


def judge(rows: list[dict], dtype: str) -> None:
    """Mark WRONG the rows of one (scheme, length) whose forward or gradient error exceeds its
    bound: the device check's rule (verify.bounds), XLA_FACTOR x the largest error among XLA's own
    paths here, within [FLOOR, CAP] of the dtype (CAP alone where no XLA path ran). XLA's paths are
    thereby held to CAP: far off, all of them, is wrong too."""
    xla = [r for r in rows if r["path"] in xla_paths() and "forward_error" in r]
    for column in ("forward_error", "gradient_error"):
        bound = verify.bounds({column: max((r[column] for r in xla), default=float("inf"))}, dtype)[column]
        for row in rows:
            row[column.replace("error", "bound")] = bound
            if row.get(column, 0.0) > bound and row["status"] == "ok":
                row["status"] = "WRONG"


def device_guard(plan: Plan, path: str, scheme, length: int):
    """(the Pallas launch or None, a note) for a path here; raises Skipped for a kernel not run.
    Pallas off GPU: the interpreter, up to the plan's length. A kernel the device check guards (on
    GPU: pallas, fused): 'refused: ...' where the check rejects it (its errors are still measured
    where it runs), and for pallas the launch the device search chose."""
    dtype = jnp.dtype(plan.dtype)
    if path == "pallas" and pallas.interpreted():
        if length > plan.interpreter_max_length:
            raise Skipped(f"interpreted (no GPU): checked up to {plan.interpreter_max_length} tokens")
        return pallas.Launch(interpret=True), "interpreted"
    if not choice.checked_here(path):
        return None, ""
    verdict = choice.device_verdict(path, scheme, dtype)
    if verdict.status in ("refused", "error"):
        raise Skipped(f"refused: {verdict.reason}")
    launch = choice.launch(path, scheme, dtype)
    label = f"{launch.label}; " if launch is not None else ""
    return launch, (f"{label}device check passed" if verdict.ok else f"refused: {verdict.reason}")


# ---- the whole run ------------------------------------------------------------------------------------

def write(result: dict, stem: pathlib.Path) -> None:
    """The JSON and markdown files of `result` (as far as it goes), each written aside and renamed."""
    write_atomically(stem.with_suffix(".json"), json.dumps(result, indent=1))
    write_atomically(stem.with_suffix(".md"), markdown(result))


def summary(rows: list[dict]) -> tuple[str, int]:
    """(the closing lines, the exit status): 1 where a path the framework would use is WRONG, else 3
    where a kernel was refused on this device (named, with why: the run uses XLA's paths instead),
    else 0."""
    wrong = [r for r in rows if r["status"] == "WRONG"]
    refused = [r for r in rows if r["status"] == "refused"]
    lines = ["every path the framework would use is within tolerance" if not wrong else
             f"{len(wrong)} WRONG row(s): " + "; ".join(f"{r['scheme']} L={r['length']} {r['path']}" for r in wrong)]
    reasons: dict[str, list[str]] = {}
    for r in refused:
        reasons.setdefault(r["note"].removeprefix("refused: "), []).append(f"{r['scheme']} L={r['length']} {r['path']}")
    lines += [f"refused here (XLA's paths used instead): {', '.join(where)}: {why}" for why, where in reasons.items()]
    left = sorted({(r["scheme"], r["length"]) for r in rows if r["status"] == "not run"}, key=lambda c: (c[1], c[0]))
    if left:
        lines.append("not run within --minutes (--minutes=0 runs every cell): "
                     + ", ".join(f"{scheme} L={length}" for scheme, length in left))
    return "\n".join(lines), 1 if wrong else 3 if refused else 0


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
            for path in measured_paths()]


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
        return {"device": device.device_kind, "backend": jax.default_backend(), "devices": jax.device_count(),
                "jax": jax.__version__, "date": datetime.date.today().isoformat(), "seconds": time.time() - started,
                "plan": dataclasses.asdict(plan), "floor": verify.FLOOR[plan.dtype], "cap": verify.CAP[plan.dtype],
                "xla_factor": verify.XLA_FACTOR, "complete": complete, "cell_seconds": timings,
                "rows": rows, "wrong": len(wrong), "refused": sum(r["status"] == "refused" for r in rows),
                "passed": not wrong}
    # shortest lengths first, so that what the budget leaves out is the longest cells
    cells = [(scheme_name, length) for length in sorted(plan.lengths) for scheme_name in plan.schemes]
    earlier = earlier_seconds(stem, plan)
    say(f"{len(cells)} (scheme, length) cells x {len(measured_paths())} paths, shortest first; "
        + estimate_text(cells, earlier, plan.minutes))
    for done, (scheme_name, length) in enumerate(cells, 1):
        begun = time.time()
        for row in rows_for(plan, scheme_name, length):
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
