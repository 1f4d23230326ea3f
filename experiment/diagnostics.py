"""Attention diagnostics of a trained run: per layer and head, the mean distance attended to and the
attention entropy by query position (models/diagnostics.py), at chosen evaluation lengths.

Results go to `WORKDIR/eval/attention.json`: a list of records, one per (split, eval_length,
overrides), merged with what the file already holds (a newer record replaces the older; records
of an older checkpoint are dropped). Values are averaged over the first `max_windows`
nonoverlapping windows of the split (the first windows `evaluate` scores), then over query
positions in at most 64 bins of geometrically growing width, as the per-position loss is.
Single host: the windows run on this process's devices.
"""
from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import corpora
from experiment import distributed
from experiment.evaluation import _binned, _data_name, apply_overrides, eval_spec, load_for_scoring, window_positions
from experiment.run import RunDir
from models.diagnostics import attention_statistics

log = logging.getLogger(__name__)

def results_path(workdir: str | pathlib.Path) -> pathlib.Path:
    return RunDir(workdir).attention_path


def load_records(workdir: str | pathlib.Path) -> list[dict]:
    """The records of WORKDIR/eval/attention.json ([] if none)."""
    return RunDir(workdir).read_records(results_path(workdir))


def record_key(record: dict) -> tuple:
    """One record per (split, eval_length, overrides)."""
    return (record.get("split"), int(record["eval_length"]), json.dumps(record.get("overrides", {}), sort_keys=True))


def first_windows(stream: np.ndarray, length: int, max_windows: int, eos_id: int) -> np.ndarray:
    """The first `max_windows` nonoverlapping windows of `stream` as model inputs (windows x length,
    the inputs `corpora.eval_batches` gives, whole windows only)."""
    inputs, _, weights = next(corpora.eval_batches(stream, length, length, max_windows, eos_id))
    inputs = inputs[weights.all(axis=1)]
    if not len(inputs):
        raise ValueError(f"the stream has {len(stream):,} tokens, fewer than one window of {length}; "
                         f"choose shorter lengths")
    return inputs


def diagnose(workdir: str | pathlib.Path, lengths: list[int] | None = None, max_windows: int = 8,
             block: int | None = None, *, split: str | None = None,
             overrides: dict[str, str] | None = None, batch_tokens: int | None = None) -> list[dict]:
    """Attention statistics of the run's newest checkpoint at each length, written to
    WORKDIR/eval/attention.json; returns the new records.

    Every argument left None comes from the run's config, as in `evaluate` (lengths, split and
    overrides from config.eval, `block` = model.attention_block, `batch_tokens` = eval.batch_tokens:
    windows per forward pass). A length the scheme cannot encode raises its LengthError.

    A record: {scheme, train_length, eval_length, step, split, windows, block, layers, heads,
    positions: [[first, last], ...] (the bins of query positions, 0-based, inclusive),
    mean_distance, entropy: layers x heads x bins (tokens; nats), data, tokenizer, overrides?}."""
    if max_windows < 1:
        raise ValueError(f"max_windows must be >= 1, got {max_windows}")
    run = RunDir(workdir)
    run.require_checkpoint()
    with run.locked("diagnostics") if distributed.is_writer() else contextlib.nullcontext():
        records = _diagnose(run, lengths, max_windows, block, split, overrides, batch_tokens)
        if distributed.is_writer():
            run.add_records(run.attention_path, records, key=record_key)
    return records


def _diagnose(run, lengths, max_windows, block, split, overrides, batch_tokens):
    config = run.load_config()
    spec = eval_spec(config, lengths, split=split, overrides=overrides)
    lengths, split, overrides = spec["lengths"], spec["split"], spec["overrides"]
    apply_overrides(config, overrides)
    block = int(block or config.model.get("attention_block", 512))
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    batch_tokens = int(batch_tokens or config.eval.batch_tokens)

    tokenizer, graphdef, params, meta, _, lengths = load_for_scoring(run, config, lengths, False, overrides,
                                                                     "diagnostics")
    model = nnx.merge(graphdef, params)
    stream, _ = run.stream(config.data, split, tokenizer, write=False)

    records = []
    for length in lengths:
        t0 = time.perf_counter()
        inputs = first_windows(stream, length, max_windows, tokenizer.eos_id)
        n = len(inputs)
        rows = max(1, min(n, batch_tokens // length))
        total = None
        for lo in range(0, n, rows):  # every forward pass one shape: the last is padded, weight 0
            index = np.arange(lo, lo + rows)
            weights = (index < n).astype(np.float32)
            index = np.minimum(index, n - 1)
            tokens = jnp.asarray(inputs[index])
            positions = window_positions(model.scheme, config, jnp.asarray(index, jnp.int32), length)  # as `evaluate`
            stats = jax.device_get(attention_statistics(model, tokens, positions, block, weights_B=weights))
            part = {k: np.asarray(v, np.float64) * weights.sum() for k, v in stats.items()}
            total = part if total is None else {k: total[k] + part[k] for k in total}
        stats = {k: v / n for k, v in total.items()}
        layers, heads, _ = stats["mean_distance"].shape
        ones = np.ones(length)
        bins = [[a, b] for a, b, _ in _binned(ones, ones)]
        record = {"scheme": config.posenc.name, "train_length": int(config.train.seq_len),
                  "eval_length": int(length), "step": int(meta["step"]), "split": split,
                  "windows": int(n), "block": block, "layers": int(layers), "heads": int(heads),
                  "positions": bins,
                  **{name: [[[v for _, _, v in _binned(values, ones)] for values in layer] for layer in stats[name]]
                     for name in ("mean_distance", "entropy")},
                  "data": _data_name(config.data), "tokenizer": tokenizer.kind,
                  **({"overrides": overrides} if overrides else {})}
        log.info("%s L=%d: attention statistics of %d window(s) in %.1f s", config.posenc.name, length, n,
                 time.perf_counter() - t0)
        records.append(record)
    return records
