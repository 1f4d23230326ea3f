"""One (scheme, length) cell of the self-check: each attention path's errors against a float32
reference, a small decoder's training and evaluation throughput with that path, the memory XLA
plans, `auto`'s picks, and the judgement of each row (experiment/selfcheck/check.py runs the cells
and writes them)."""
from __future__ import annotations

import contextlib
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from experiment.config import TrainConfig
from experiment.runtime.accelerator import program_bytes
from experiment.selfcheck.plan import Plan
from experiment.train.optimizer import make_optimizer
from experiment.train.step import make_train_step
from models import DecoderLM
from models.attention import choice, pallas, paths, tuning, verify
from models.attention.dense import dense_attention
from models.config import ModelConfig

PATHS: tuple[str, ...] = ()  # the attention paths measured; empty: every row of models/attention/paths.py
REFERENCE_CHUNK = 512  # queries per chunk of the float32 reference


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
    """`auto`'s path for the plan's training step (inside `choice.training_calls`, as the step traces
    it: its race is forward and backward), for its evaluation (forward only), and for training with
    attention dropout (None where no path takes the scheme so: stick-breaking with attention dropout)."""
    options = {k: v for k, v in plan.model.items() if k != "vocab_size"}
    cfg = ModelConfig(vocab_size=plan.model["vocab_size"], attention="auto", dtype=plan.dtype, **options)
    rows = max(1, plan.step_tokens // length)
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length))
    picks = {}
    for label, dropout, training in (("train", 0.0, True), ("eval", 0.0, False), ("attention dropout", 0.1, True)):
        call_cfg = dataclasses.replace(cfg, attention_dropout=dropout)
        try:
            with choice.training_calls(rows) if training else contextlib.nullcontext():
                picks[label] = choice.choose(call_cfg, scheme, pos, jnp.dtype(plan.dtype), dropping=dropout > 0)
        except ValueError:
            picks[label] = None
    return picks


def picked_for(picks: dict, path: str) -> str:
    """The labels of `auto_picks` that chose `path` ('train, eval', ...)."""
    return ", ".join(label for label, pick in picks.items() if pick == path)


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
                 "auto": picked_for(picks, path), "note": f"the reference {e}"} for path in measured_paths()]
    for path in measured_paths():
        row = {"scheme": scheme_name, "length": length, "path": path,
               "auto": picked_for(picks, path), "status": "ok", "note": ""}
        rows.append(row)
        refusal = paths.PATHS[path].accepts(scheme.traits, paths.CallSpec.of(scheme, length, plan.dtype, training=True))
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
    where it runs), and for pallas the launch the device search chose for the plan's training step
    at this length."""
    dtype = jnp.dtype(plan.dtype)
    if path == "pallas" and pallas.interpreted():
        if length > plan.interpreter_max_length:
            raise Skipped(f"interpreted (no GPU): checked up to {plan.interpreter_max_length} tokens")
        return pallas.Launch(interpret=True), "interpreted"
    if not choice.checked_here(path):
        return None, ""
    work = tuning.Workload(max(1, plan.step_tokens // length), length)
    verdict = choice.device_verdict(path, scheme, dtype, work)
    if verdict.status in ("refused", "error"):
        raise Skipped(f"refused: {verdict.reason}")
    launch = tuning.device_launch(scheme, dtype, work) if paths.PATHS[path].tuned else None
    label = f"{launch.label}; " if launch is not None else ""
    return launch, (f"{label}device check passed" if verdict.ok else f"refused: {verdict.reason}")
