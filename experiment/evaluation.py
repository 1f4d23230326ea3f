"""Perplexity at many evaluation lengths (the protocol of Press et al. 2022, see corpora.batching).

The windows of a batch are split over every device of the job; each length compiles one program
(the last batch is padded to the same shape), and the entry points cache compiled programs on disk
(experiment/accelerator.py), so evaluating the same shapes again compiles nothing.

Results go to `WORKDIR/eval/extrapolation.json`: a list of records, one per (split, eval_length,
stride), merged with what the file already holds.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

import corpora
import posenc
from experiment import config_util, distributed, records, sharding
from experiment.run import RunDir
from experiment.tensorboard import EventWriter
from experiment.training import build_model
from models.attention import attention_path

log = logging.getLogger(__name__)

POSITION_BINS = 64  # per-position loss is stored in at most this many bins
MAX_LOGITS_BYTES = 1 << 30
MAX_SCORES_BYTES = 1 << 30
EVAL_POSITIONS_STREAM = 7  # folded into the run's seed for evaluation-time position draws


def eval_batch_size(length: int, vocab_size: int, num_heads: int, batch_tokens: int,
                    tile: int | None = None) -> int:
    """Windows per batch: `batch_tokens` tokens, fewer if the logits (B*L*V) or the attention scores
    would pass 1 GiB (B*H*L*L dense; B*H*L*tile blockwise, `tile` given); never fewer than one."""
    by_tokens = batch_tokens // length
    by_logits = MAX_LOGITS_BYTES // (4 * length * vocab_size)
    by_scores = MAX_SCORES_BYTES // (4 * num_heads * length * min(length, tile or length))
    return max(1, min(by_tokens, by_logits, by_scores))


def attention_tile(model_cfg, scheme_cls, length: int) -> int | None:
    """The key-tile width attention will use at this length (None: dense, full rows)."""
    block = model_cfg.get("attention_block", 512)
    path = attention_path(model_cfg.get("attention", "auto"), block, scheme_cls, length)
    if path == "pallas":
        from models.pallas_attention import BLOCK
        return BLOCK
    return block if path == "blockwise" else None


EVAL_OVERRIDABLE = ("posenc.", "model.attention")


def apply_overrides(config, overrides: dict[str, str]) -> None:
    """Set eval-time knobs (scheme options that change no parameters, the attention path) on a
    loaded config, typed like the values they replace."""
    for dotted, raw in overrides.items():
        if not dotted.startswith(EVAL_OVERRIDABLE) or dotted == "posenc.name":
            raise ValueError(f"--set {dotted}: only posenc.<scheme>.<option> and model.attention* can change "
                             f"at evaluation (anything else needs a new training run)")
        posenc.check_option_key(config.posenc, dotted)
        parents, leaf = dotted.split(".")[:-1], dotted.split(".")[-1]
        if parents == ["model"] and leaf not in config.model:  # a run saved before the option existed
            from models.decoder import ModelConfig
            config.model[leaf] = ModelConfig.__dataclass_fields__[leaf].default
        if parents[:1] == ["posenc"] and len(parents) == 2 and leaf not in config.posenc.get(parents[1], {}):
            defaults = posenc.default_config(parents[1])  # likewise for a scheme option
            if parents[1] not in config.posenc:
                config.posenc[parents[1]] = defaults[parents[1]].to_dict()
            config.posenc[parents[1]][leaf] = defaults[parents[1]][leaf]
        config_util.set_typed(config, dotted, raw)


def eval_spec(config, lengths=None, stride=None, split=None, max_tokens=None, overrides=None) -> dict:
    """What to evaluate, from the run's `config.eval` (lengths, stride, split, max_tokens, overrides)
    with any argument given taking its place; checked. Training, sweeps and eval_extrapolate.py all
    read it here."""
    ev = config.eval
    spec = {"lengths": [int(x) for x in (lengths or ev.lengths)],
            "stride": int(ev.get("stride", 0) if stride is None else stride),
            "split": split or ev.split,
            "max_tokens": int(ev.get("max_tokens", 0) if max_tokens is None else max_tokens),
            "overrides": dict(parse_overrides(ev.get("overrides", "")) if overrides is None else overrides)}
    if not spec["lengths"] or any(l < 1 for l in spec["lengths"]):
        raise ValueError(f"evaluation lengths must be positive, got {spec['lengths']}; set --lengths "
                         f"(or --config.eval.lengths / eval.length_multipliers)")
    if spec["stride"] < 0 or spec["stride"] > min(spec["lengths"]):
        raise ValueError(f"stride {spec['stride']} must be between 0 (nonoverlapping) and the shortest "
                         f"evaluation length {min(spec['lengths'])}; pass --stride (or --config.eval.stride)")
    if spec["max_tokens"] < 0:
        raise ValueError(f"max_tokens must be >= 0 (0 = the whole split), got {spec['max_tokens']}; "
                         f"pass --max_tokens (or --config.eval.max_tokens)")
    return spec


def parse_overrides(text: str) -> dict[str, str]:
    """'posenc.rope.yarn_scale=4,model.attention=blockwise' -> {key: value} (config.eval.overrides)."""
    items = [item.strip() for item in str(text or "").split(",") if item.strip()]
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ValueError(f"an evaluation override takes KEY=VALUE, got {bad[0]!r}")
    return dict(item.split("=", 1) for item in items)


def load_for_scoring(run: RunDir, config, lengths: list[int], skip_impossible: bool, overrides: dict,
                     what: str = "eval"):
    """(tokenizer, graphdef, params, meta, mesh, lengths) of the run's newest readable checkpoint,
    parameters on every device (whatever mesh.fsdp stored them as in training: scoring has no
    optimizer state and needs them whole). Lengths the scheme cannot encode raise its LengthError,
    or are dropped with a warning when `skip_impossible`. Evaluation, passkey scoring and the
    attention diagnostics all load here."""
    tokenizer = run.tokenizer(config.data, write=False)
    model = nnx.eval_shape(lambda: build_model(config, tokenizer.vocab_size))
    kept = []
    for length in lengths:
        try:
            model.scheme.check_length(length)
            kept.append(length)
        except posenc.LengthError as e:
            if not skip_impossible:
                raise
            log.warning("skipping %s length %d: %s", what, length, e)
    mesh = sharding.mesh_from_config(config)
    graphdef, abstract_params = nnx.split(model)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())),
                          abstract_params)
    try:
        params, _, meta = run.restore(params)
    except ValueError as e:
        if not overrides:
            raise
        raise ValueError(f"the checkpoint does not fit the model with {overrides}: an overridden option changes "
                         f"the parameters, so it cannot change at evaluation ({str(e).splitlines()[0][:200]})") from e
    return tokenizer, graphdef, params, meta, mesh, kept


def window_positions(scheme, config, rows: jax.Array, length: int) -> jax.Array | None:
    """Positions for windows `rows` (their indices in the evaluation) where the scheme samples them
    at evaluation (randomized: each window its own draw from the run's seed, so a result does not
    depend on batching); None otherwise (0 .. T-1)."""
    if not scheme.samples_positions:
        return None
    seed = jax.random.fold_in(jax.random.key(int(config.seed)), EVAL_POSITIONS_STREAM)

    def draw(row):
        return scheme.sample_positions(jnp.arange(length)[None], jax.random.fold_in(seed, row), training=False)[0]
    return jax.vmap(draw)(rows)


def evaluate(workdir: str | pathlib.Path, lengths: list[int] | None = None, stride: int | None = None,
             split: str | None = None, batch_tokens: int | None = None,
             skip_impossible: bool = False, max_tokens: int | None = None,
             overrides: dict[str, str] | None = None) -> list[dict]:
    """Evaluate the run's newest checkpoint at each length; every argument left None comes from the
    run's config.eval (`eval_spec`). stride 0 = nonoverlapping.

    `max_tokens` > 0 scores only the first max_tokens tokens of the split (quick looks and
    CPU-sized sliding windows; the record says so), 0 the whole split.
    `overrides` ({"posenc.rope.yarn_scale": "4"}) switch eval-time knobs on without retraining;
    the records carry them. An override for a scheme the run does not use is refused.

    A length the scheme cannot encode raises its LengthError, or is skipped with a warning when
    `skip_impossible` (sweeps that include a learned table)."""
    run = RunDir(workdir)
    run.require_checkpoint()
    with run.locked("evaluation") if distributed.is_writer() else contextlib.nullcontext():
        return _evaluate(run, lengths, stride, split, batch_tokens, skip_impossible, max_tokens, overrides)


def _evaluate(run, lengths, stride, split, batch_tokens, skip_impossible, max_tokens, overrides):
    config = run.load_config()
    spec = eval_spec(config, lengths, stride, split, max_tokens, overrides)
    lengths, stride, split, max_tokens, overrides = (spec[k] for k in ("lengths", "stride", "split",
                                                                       "max_tokens", "overrides"))
    apply_overrides(config, overrides)
    batch_tokens = batch_tokens or config.eval.batch_tokens

    tokenizer, graphdef, params, meta, mesh, lengths = load_for_scoring(run, config, lengths, skip_impossible,
                                                                        overrides)
    stream, words = run.stream(config.data, split, tokenizer, write=distributed.is_writer())
    if max_tokens and max_tokens < len(stream):
        stream = stream[:max_tokens]
        words = corpora.count_words_in_text(tokenizer.decode(stream))
    @functools.partial(jax.jit, out_shardings=NamedSharding(mesh, P()))  # sums, on every device
    def score(params, inputs, targets, weights, windows):
        model = nnx.merge(graphdef, params)
        positions = window_positions(model.scheme, config, windows, inputs.shape[1])
        nll = model.token_nll(inputs, targets, positions) * weights
        return nll.sum(), nll.sum(axis=0), weights.sum(axis=0)

    writer = distributed.is_writer()
    results = []
    with EventWriter(run.tensorboard_dir) if writer else contextlib.nullcontext() as board:
        for length in lengths:
            results.append(_score_length(run, config, length, stride, split, max_tokens, overrides, tokenizer,
                                         stream, words, params, meta, mesh, score, batch_tokens, board))
    return results


def _score_length(run, config, length, stride, split, max_tokens, overrides, tokenizer, stream, words,
                  params, meta, mesh, score, batch_tokens, board) -> dict:
    """One evaluation length: its record, written (with its TensorBoard scalar) by the writer."""
    batch_sharding = sharding.batch_sharding(mesh)
    writer = board is not None
    s = stride or length
    batch = eval_batch_size(length, tokenizer.vocab_size, config.model.num_heads, batch_tokens,
                            attention_tile(config.model, posenc.get(config.posenc.name), length))
    batch = -(-batch // mesh.size) * mesh.size  # whole rows per device; every batch one shape
    windows = corpora.EvalWindows(len(stream), length, s)
    total, count = 0.0, 0.0
    pos_nll, pos_count = np.zeros(length), np.zeros(length)
    t0 = time.perf_counter()
    for index, (inputs, targets, weights) in enumerate(tqdm(
            corpora.eval_batches(stream, length, s, batch, tokenizer.eos_id),
            total=math.ceil(len(windows) / batch), desc=f"eval {config.posenc.name} L={length} S={s}",
            unit="batch", dynamic_ncols=True, disable=None if writer else True, leave=False)):
        window_ids = np.arange(index * batch, (index + 1) * batch, dtype=np.int32)
        arrays = sharding.global_batch(
            batch_sharding, inputs.shape,
            lambda lo, hi: (inputs[lo:hi], targets[lo:hi], weights[lo:hi], window_ids[lo:hi]))
        nll_sum, nll_pos, w_pos = jax.device_get(score(params, *arrays))
        total += float(nll_sum)
        pos_nll += nll_pos
        pos_count += w_pos
        count += float(w_pos.sum())
    elapsed = time.perf_counter() - t0
    nll = total / count
    record = {"scheme": config.posenc.name, "train_length": int(config.train.seq_len),
              "eval_length": length, "stride": s, "split": split, "tokens": int(count),
              "nll": nll, "ppl": math.exp(nll), "tokenizer": tokenizer.kind,
              "step": int(meta["step"]), "tokens_per_s": count / elapsed,
              "max_tokens": int(max_tokens), "data": _data_name(config.data),
              **({"overrides": overrides} if overrides else {}),
              "position_nll": _binned(pos_nll, pos_count)}
    if tokenizer.kind != "word":
        record.update(words=words, word_ppl=math.exp(total / words))
    log.info("%s L=%d S=%d: ppl %.3f over %d tokens", config.posenc.name, length, s, record["ppl"], count)
    if writer:
        run.add_results([record])  # each length kept as it finishes
        board.scalar(records.tensorboard_tag(record), record["ppl"], record["step"])
    return record


def _data_name(data) -> str:
    return data.name if data.source in ("builtin", "hf") else str(data.path)


def _binned(nll_sum: np.ndarray, counts: np.ndarray) -> list[list[float]]:
    """[[first position, last position, mean nll], ...] in at most POSITION_BINS bins of
    geometrically growing width (the first positions one by one), for log-scale plots."""
    edges = np.unique(np.concatenate([[0], np.geomspace(1, len(nll_sum), POSITION_BINS).round().astype(int)]))
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        c = counts[a:b].sum()
        if c > 0:
            out.append([int(a), int(b - 1), float(nll_sum[a:b].sum() / c)])
    return out
