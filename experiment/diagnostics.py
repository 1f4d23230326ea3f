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
from jax.sharding import NamedSharding, PartitionSpec as P

import corpora
from experiment import distributed, sharding
from experiment.evaluation import EVAL_POSITIONS_STREAM, _binned, _data_name, apply_overrides, eval_spec
from experiment.run import RunDir
from experiment.training import build_model
from models.diagnostics import attention_statistics

log = logging.getLogger(__name__)

def results_path(workdir: str | pathlib.Path) -> pathlib.Path:
    return RunDir(workdir).attention_path


def load_records(workdir: str | pathlib.Path) -> list[dict]:
    """The records of WORKDIR/eval/attention.json ([] if none)."""
    path = results_path(workdir)
    if not path.exists():
        return []
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is damaged ({e}); delete it and run the diagnostics again") from e


def _key(record: dict) -> tuple:
    return (record.get("split"), int(record["eval_length"]), json.dumps(record.get("overrides", {}), sort_keys=True))


def _merge(old: list[dict], new: list[dict]) -> list[dict]:
    """A new record replaces the one with its key; records of an older checkpoint are dropped."""
    merged = {_key(r): r for r in old}
    merged.update({_key(r): r for r in new})
    newest = max((int(r["step"]) for r in new), default=0)
    stale = [r for r in merged.values() if int(r.get("step", 0)) < newest]
    if stale:
        log.warning("dropped %d attention record(s) of an older checkpoint (step %s)", len(stale),
                    sorted({r.get("step") for r in stale}))
    return sorted((r for r in merged.values() if int(r.get("step", 0)) >= newest),
                  key=lambda r: (str(r.get("split")), r["eval_length"], _key(r)[2]))


def _write(workdir, new: list[dict]) -> None:
    path = results_path(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_merge(load_records(workdir), new), indent=1))
    tmp.replace(path)


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
            _write(run.path, records)
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

    tokenizer = run.tokenizer(config.data, write=False)
    model = nnx.eval_shape(lambda: build_model(config, tokenizer.vocab_size))
    for length in lengths:
        model.scheme.check_length(length)
    mesh = sharding.mesh_from_config(config)
    graphdef, abstract_params = nnx.split(model)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())),
                          abstract_params)
    params, _, meta = run.restore(params)
    model = nnx.merge(graphdef, params)
    stream, _ = run.stream(config.data, split, tokenizer, write=False)
    position_seed = jax.random.fold_in(jax.random.key(int(config.seed)), EVAL_POSITIONS_STREAM)

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
            positions = None
            if model.scheme.samples_positions:  # the draw `evaluate` makes for these windows
                positions = jax.vmap(lambda w: model.scheme.sample_positions(
                    jnp.arange(length)[None], jax.random.fold_in(position_seed, w), training=False)[0]
                )(jnp.asarray(index, jnp.int32))
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
