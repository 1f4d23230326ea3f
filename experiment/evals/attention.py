"""Attention statistics of a trained run: per layer and head, the mean distance attended to and the
attention entropy by query position (models/attention/statistics.py), at chosen evaluation lengths.

Records (kind `attention`, WORKDIR/eval/attention.json; experiment/store/records.py): one per (split,
eval_length, overrides), merged with what the file already holds. Values are averaged over the first `max_windows`
nonoverlapping windows of the split (the first windows `evaluate` scores), then over query
positions in at most 64 bins of geometrically growing width, as the per-position loss is.
Single host: the windows run on this process's devices.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import corpora
from experiment.evals.common import EvalSpec, Scoring, binned, eval_spec, window_positions
from experiment.evals.kinds import EvalKind, Option, Request, SPLIT, Target, evaluate_kinds
from experiment.runtime import interrupts
from experiment.store.run import RunDir
from models.attention.statistics import attention_statistics
from posenc.domains import at_least

log = logging.getLogger(__name__)


def first_windows(stream: np.ndarray, length: int, max_windows: int, eos_id: int) -> np.ndarray:
    """The first `max_windows` nonoverlapping windows of `stream` as model inputs (windows x length,
    the inputs `corpora.eval_batches` gives, whole windows only)."""
    inputs, _, weights = next(corpora.eval_batches(stream, length, length, max_windows, eos_id))
    inputs = inputs[weights.all(axis=1)]
    if not len(inputs):
        raise ValueError(f"the stream has {len(stream):,} tokens, fewer than one window of {length}; "
                         f"choose shorter lengths")
    return inputs


def evaluate_attention(workdir: str | pathlib.Path | RunDir, lengths: list[int] | None = None, max_windows: int = 8,
                       block: int | None = None, *, split: str | None = None,
                       overrides: dict[str, str] | None = None, batch_tokens: int | None = None) -> list[dict]:
    """Attention statistics of the run's newest checkpoint at each length, written to
    WORKDIR/eval/attention.json; returns the new records.

    Every argument left None comes from the run's config, as in `evaluate` (lengths, split and
    overrides from config.eval, `block` = model.attention_block, `batch_tokens` = eval.batch_tokens:
    windows per forward pass). A length the scheme cannot encode raises its LengthError.

    A record: {scheme, train_length, eval_length, step, split, windows, block, layers, heads,
    positions: [[first, last], ...] (the bins of query positions, 0-based, inclusive),
    mean_distance, entropy: layers x heads x bins (tokens; nats), data, tokenizer, overrides?}.
    One kind of evaluate_kinds."""
    request = Request(lengths, overrides, batch_tokens, False,
                      {"attention_windows": max_windows, "split": split, "attention_block": block})
    return evaluate_kinds(workdir, ("attention",), request)["attention"]


@dataclasses.dataclass(frozen=True)
class Settings:
    spec: EvalSpec
    windows: int  # the first nonoverlapping windows of the split, per length
    block: int    # the key block of the statistics


def _check(target: Target, request: Request) -> Settings:
    """The split and the lengths as perplexity reads them; windows and `attention_block` (not a flag:
    model.attention_block unless a caller gives one) at least 1."""
    windows, block = request.option(WINDOWS), int(request.options.get("attention_block") or
                                                  target.config.model.attention_block)
    if windows < 1 or block < 1:
        raise ValueError(f"attention statistics need --attention_windows >= 1 and a key block >= 1, got "
                         f"{windows} and {block}")
    return Settings(eval_spec(target.config, target.lengths, split=request.option(SPLIT), overrides=target.overrides),
                    int(windows), block)


def _score(scoring: Scoring, settings: Settings, batch_tokens: int) -> list[dict]:
    stream, _ = scoring.run.stream(scoring.config.data, settings.spec.split, scoring.tokenizer, write=False)
    new = []
    for length in scoring.lengths:  # written together at the end: a Ctrl-C keeps none of them
        inputs = first_windows(stream, length, settings.windows, scoring.tokenizer.eos_id)
        new.append(_statistics(scoring, settings.spec, length, inputs, (settings.block, batch_tokens)))
        interrupts.check(lambda: scoring.interrupted("attention", [], length))
    scoring.write("attention", new)
    return new


def _statistics(scoring: Scoring, spec: EvalSpec, length: int, inputs: np.ndarray, sizes: tuple[int, int]) -> dict:
    """The record of one length from its windows `inputs`. `sizes`: (key block, tokens per pass)."""
    block, batch_tokens = sizes
    model, t0, n = scoring.model(), time.perf_counter(), len(inputs)
    rows = max(1, min(n, batch_tokens // length))
    total = None
    for lo in range(0, n, rows):  # every forward pass one shape: the last is padded, weight 0
        index = np.arange(lo, lo + rows)
        weights = (index < n).astype(np.float32)
        index = np.minimum(index, n - 1)
        positions = window_positions(model.scheme, scoring.config, jnp.asarray(index, jnp.int32), length)
        stats = jax.device_get(attention_statistics(model, jnp.asarray(inputs[index]), positions, block,
                                                    weights_B=weights))
        part = {k: np.asarray(v, np.float64) * weights.sum() for k, v in stats.items()}
        total = part if total is None else {k: total[k] + part[k] for k in total}
    stats = {k: v / n for k, v in total.items()}
    layers, heads, _ = stats["mean_distance"].shape
    ones = np.ones(length)
    record = {**scoring.header(), "eval_length": int(length), "split": spec.split, "windows": int(n),
              "block": block, "layers": int(layers), "heads": int(heads),
              "positions": [[a, b] for a, b, _ in binned(ones, ones)],
              **{name: [[[v for _, _, v in binned(values, ones)] for values in layer] for layer in stats[name]]
                 for name in ("mean_distance", "entropy")}}
    log.info("%s L=%d: attention statistics of %d window(s) in %.1f s", scoring.config.posenc.name, length, n,
             time.perf_counter() - t0)
    return record


WINDOWS = Option("attention_windows", 8, "windows per length for --attention", domain=at_least(1),
                 example="--attention_windows=8")

KIND = EvalKind("attention", "write each layer's and head's mean attention distance and entropy by query position "
                "to DIR/eval/attention.json (first --attention_windows windows)", (SPLIT, WINDOWS), _check,
                lambda scoring, settings, batch_tokens: _score(scoring, settings, batch_tokens),
                lambda r: f"attention L={r['eval_length']}: {r['windows']} window(s) -> eval/attention.json",
                "attention statistics", aliases=("attention_stats",))
