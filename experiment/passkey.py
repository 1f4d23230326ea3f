"""Passkey retrieval accuracy at many lengths and depths (corpora/passkey.py builds the task).

An example counts as correct iff the model's argmax at every answer position is the answer token,
teacher forced: the same as greedy decoding producing the answer after the final cue. Each
(eval_length, depth) cell scores `per_cell` examples; example i has the same key in every cell.

Results go to `WORKDIR/eval/passkey.json`: a list of records
    {task: "passkey", eval_length, depth, accuracy, count, step, digits, scheme, train_length, ...}
merged with what the file holds: a new record replaces the one with its (eval_length, depth,
digits, overrides), and records of an older checkpoint are dropped.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import pathlib
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import posenc
from corpora import passkey as task
from experiment import distributed, sharding
from experiment.evaluation import (apply_overrides, attention_tile, eval_batch_size, load_for_scoring,
                                   window_positions)
from experiment.run import RunDir

log = logging.getLogger(__name__)

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclasses.dataclass(frozen=True)
class Scores:
    """Per example: `exact` (every answer token right) and `token_accuracy` (the fraction right)."""
    exact: np.ndarray
    token_accuracy: np.ndarray


def score_examples(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], batch: task.PasskeyBatch,
                   batch_size: int | None = None) -> Scores:
    """Score a passkey batch with `fn(inputs_BxL, rows_B)`, which returns logits B x L x V (or the
    argmax ids, B x L) for those inputs; `rows_B` are the examples' indices in `batch` (a fake model
    in a test can look its targets up; the real one draws per-example positions from them).
    Calls `fn` on `batch_size` rows at a time (default: all), the last call padded with copies of
    the last example so that every call has one shape (one compilation)."""
    n = len(batch)
    if n == 0:
        return Scores(np.zeros(0, bool), np.zeros(0))
    size = batch_size or n
    predicted = np.zeros(batch.targets.shape, np.int64)
    for lo in range(0, n, size):
        rows = np.minimum(np.arange(lo, lo + size), n - 1)
        out = np.asarray(fn(batch.inputs[rows], rows.astype(np.int32)))
        ids = out.argmax(-1) if out.ndim == 3 else out
        keep = min(size, n - lo)
        predicted[lo:lo + keep] = ids[:keep]
    right = (predicted == batch.targets) & batch.answer_mask
    per_example = batch.answer_mask.sum(axis=1)
    return Scores(exact=right.sum(axis=1) == per_example, token_accuracy=right.sum(axis=1) / per_example)


def cell_records(batch: task.PasskeyBatch, scores: Scores, length: int, **fields) -> list[dict]:
    """One record per depth of a batch of one length."""
    out = []
    for depth in sorted(set(batch.depths.tolist())):
        sel = batch.depths == depth
        out.append({"task": "passkey", "eval_length": int(length), "depth": float(depth),
                    "accuracy": float(scores.exact[sel].mean()),
                    "token_accuracy": float(scores.token_accuracy[sel].mean()),
                    "count": int(sel.sum()), **fields})
    return out


def evaluate_passkey(workdir: str | pathlib.Path, lengths: Sequence[int], depths: Sequence[float] = DEPTHS,
                     per_cell: int = 20, seed: int = 1234, digits: int | None = None, *,
                     batch_tokens: int | None = None, skip_impossible: bool = False,
                     overrides: dict[str, str] | None = None) -> list[dict]:
    """Passkey accuracy of the run's newest checkpoint at each (length, depth); records written to
    WORKDIR/eval/passkey.json and returned. `digits` defaults to the run's data.passkey_digits
    (4). A length the scheme cannot encode raises its LengthError, or is skipped with a warning
    when `skip_impossible`; a length too short for the task raises PasskeyError. `overrides`
    switch eval-time knobs as in experiment.evaluation.evaluate."""
    run = RunDir(workdir)
    run.require_checkpoint()
    with run.locked("evaluation") if distributed.is_writer() else contextlib.nullcontext():
        return _evaluate_passkey(run, [int(l) for l in lengths], [float(d) for d in depths], int(per_cell),
                                 int(seed), digits, batch_tokens, skip_impossible, dict(overrides or {}))


def _evaluate_passkey(run, lengths, depths, per_cell, seed, digits, batch_tokens, skip_impossible, overrides):
    if not lengths or per_cell < 1 or not depths:
        raise ValueError(f"need lengths, depths and per_cell >= 1, got {lengths}, {depths}, {per_cell}")
    config = run.load_config()
    apply_overrides(config, overrides)
    digits = int(config.data.get("passkey_digits", task.DEFAULT_DIGITS) if digits is None else digits)
    batch_tokens = batch_tokens or config.eval.get("batch_tokens", 16384)
    tokenizer = run.tokenizer(config.data, write=False)
    for length in lengths:  # a too-short length is refused before the checkpoint is read
        task.passkey_example(tokenizer, length, 0.5, seed, digits)
    tokenizer, graphdef, params, meta, mesh, lengths = load_for_scoring(run, config, list(lengths), skip_impossible,
                                                                        overrides, "passkey")
    batches = {length: task.passkey_batch(tokenizer, length, depths, per_cell, seed, digits) for length in lengths}

    @functools.partial(jax.jit, out_shardings=NamedSharding(mesh, P()))  # every host gets every row
    def predict(params, inputs, rows):
        model = nnx.merge(graphdef, params)
        positions = window_positions(model.scheme, config, rows, inputs.shape[1])  # randomized: per example
        return jnp.argmax(model(inputs, positions), axis=-1).astype(jnp.int32)

    batch_sharding = sharding.batch_sharding(mesh)
    writer = distributed.is_writer()
    fields = {"step": int(meta["step"]), "digits": digits, "scheme": config.posenc.name,
              "train_length": int(config.train.seq_len), "tokenizer": tokenizer.kind, "seed": seed,
              "chance": 10.0 ** -digits, "passkey_fraction": float(config.data.get("passkey_fraction", 0.0)),
              **({"overrides": overrides} if overrides else {})}

    results = []
    for length, batch in batches.items():
        size = eval_batch_size(length, tokenizer.vocab_size, config.model.num_heads, batch_tokens,
                               attention_tile(config.model, posenc.get(config.posenc.name), length))
        size = min(size, len(batch))
        size = -(-size // mesh.size) * mesh.size  # whole rows per device; every call one shape

        def fn(inputs, rows):
            arrays = sharding.global_batch(batch_sharding, inputs.shape, lambda lo, hi: (inputs[lo:hi], rows[lo:hi]))
            return jax.device_get(predict(params, *arrays))

        scores = score_examples(fn, batch, size)
        cells = cell_records(batch, scores, length, **fields)
        log.info("passkey %s L=%d: accuracy %s", config.posenc.name, length,
                 ", ".join(f"{r['depth']:g}: {r['accuracy']:.2f}" for r in cells))
        results.extend(cells)
        if writer:
            add_passkey_results(run.path, cells)  # each length kept as it finishes
    return results


# --- WORKDIR/eval/passkey.json ----------------------------------------------------------------

def results_path(workdir: str | pathlib.Path) -> pathlib.Path:
    return RunDir(workdir).passkey_path


def record_key(record: dict) -> tuple:
    """One record per (eval_length, depth, digits, overrides)."""
    return (int(record["eval_length"]), float(record["depth"]), int(record.get("digits", task.DEFAULT_DIGITS)),
            json.dumps(record.get("overrides", {}), sort_keys=True))


def load_passkey_results(workdir: str | pathlib.Path) -> list[dict]:
    return RunDir(workdir).read_records(results_path(workdir))


def add_passkey_results(workdir: str | pathlib.Path, new: list[dict]) -> list[dict]:
    """Merge `new` into WORKDIR/eval/passkey.json (experiment/records.merge with `record_key`)."""
    return RunDir(workdir).add_records(results_path(workdir), new, key=record_key)