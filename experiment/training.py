"""Training: config -> data -> model -> AdamW with warm-up + cosine -> checkpoints -> evaluation.

The hot loop uses the functional NNX pattern: `nnx.split` once, a plain `jax.jit` step that
merges, computes the loss, and returns new state, with buffer donation. The batch is sharded over
every local device along a `data` mesh axis; parameters and optimizer state are replicated.
"""
from __future__ import annotations

import json
import logging
import pathlib
import time
from typing import Callable

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

import corpora
from experiment import checkpoints, config_util
from models import DecoderLM, ModelConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """The config or workdir is inconsistent; the message says what to change."""


# --- data --------------------------------------------------------------------------------------

def load_tokenizer_for(config, workdir: pathlib.Path, train_lines: Callable[[], list[str]]):
    """The run's tokenizer: read from the workdir, or built from the train split and saved there."""
    path = workdir / "tokenizer.json"
    if path.exists():
        return corpora.load_tokenizer(path)
    lines = train_lines() if config.data.tokenizer != "byte" else None
    tokenizer = corpora.build_tokenizer(config.data.tokenizer, lines, config.data.get("vocab_size", 0))
    corpora.save_tokenizer(tokenizer, path)
    return tokenizer


def load_stream(config, workdir: pathlib.Path, split_name: str, tokenizer, lines=None) -> np.ndarray:
    """Token stream of one split, cached as .npy in the workdir (word-level encoding of a large
    split is slow in Python)."""
    cache = workdir / "streams" / f"{split_name}.npy"
    if cache.exists():
        return np.load(cache)
    if lines is None:
        lines = corpora.load_lines(config.data, split_name)
    stream = tokenizer.encode_lines(lines)
    cache.parent.mkdir(exist_ok=True)
    np.save(cache.with_suffix(".tmp.npy"), stream)
    cache.with_suffix(".tmp.npy").replace(cache)
    return stream


# --- model and optimizer ----------------------------------------------------------------------

def build_model(config, vocab_size: int, seed: int | None = None) -> DecoderLM:
    model_cfg = ModelConfig.from_config(config.model, vocab_size)
    return DecoderLM(model_cfg, config.posenc, config.train.seq_len,
                     rngs=nnx.Rngs(config.seed if seed is None else seed))


OPTIMIZERS = ("adamw", "nag")


def lr_schedule(train_cfg) -> optax.Schedule:
    """Linear warm-up from train.warmup_init_lr to train.lr, then cosine to lr * min_lr_ratio at
    train.steps (fairseq's `cosine` scheduler with one period, as in Press et al.)."""
    return optax.warmup_cosine_decay_schedule(
        init_value=train_cfg.get("warmup_init_lr", 0.0), peak_value=train_cfg.lr,
        warmup_steps=train_cfg.warmup_steps, decay_steps=max(train_cfg.steps, train_cfg.warmup_steps + 1),
        end_value=train_cfg.lr * train_cfg.min_lr_ratio)


def make_optimizer(train_cfg) -> optax.GradientTransformation:
    """Gradient clipping, then AdamW (decay on matrices only) or NAG (SGD with Nesterov momentum)."""
    schedule = lr_schedule(train_cfg)
    name = train_cfg.get("optimizer", "adamw")
    if name == "adamw":
        decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
        opt = optax.adamw(schedule, b1=train_cfg.b1, b2=train_cfg.b2,
                          weight_decay=train_cfg.weight_decay, mask=decay_mask)
    elif name == "nag":
        opt = optax.sgd(schedule, momentum=train_cfg.momentum, nesterov=True)
    else:
        raise ConfigError(f"unknown train.optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
    return optax.chain(optax.clip_by_global_norm(train_cfg.grad_clip), opt)


def lr_at(train_cfg, step: int) -> float:
    return float(lr_schedule(train_cfg)(step))


def make_train_step(graphdef, tx, dropout_seed: int):
    def train_step(params, opt_state, inputs_BxT, targets_BxT, step):
        key = jax.random.fold_in(jax.random.key(dropout_seed), step)

        def loss_fn(p):
            return nnx.merge(graphdef, p).token_nll(inputs_BxT, targets_BxT, dropout_key=key).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return jax.jit(train_step, donate_argnums=(0, 1))


def data_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


# --- the run ----------------------------------------------------------------------------------

def _prepare_workdir(config, workdir: pathlib.Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.json"
    if path.exists():
        diffs = config_util.config_differences(json.loads(path.read_text()), config.to_dict())
        if diffs:
            raise ConfigError(f"{workdir} holds a run with a different config ({'; '.join(diffs)}); "
                              f"use a new --workdir, or delete this one to start over")
    config_util.save_config(config, path)


def _truncate_metrics(path: pathlib.Path, last_step: int) -> None:
    """Drop metrics logged after the checkpoint we resume from, so the log has each step once."""
    if not path.exists():
        return
    kept = [l for l in path.read_text().splitlines() if l.strip() and json.loads(l)["step"] <= last_step]
    path.write_text("".join(l + "\n" for l in kept))


def train(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
          max_steps: int | None = None) -> dict:
    """Train (or resume) the run in `workdir`. `max_steps` stops after that many steps in this call
    (for time-sliced jobs); Ctrl-C saves a checkpoint first. Returns a summary dict."""
    config = config_util.resolve(config)
    workdir = pathlib.Path(workdir)
    _prepare_workdir(config, workdir)
    tc = config.train
    n_dev = jax.device_count()
    if tc.batch_size % n_dev:
        raise ConfigError(f"train.batch_size={tc.batch_size} is not divisible by the {n_dev} devices; "
                          f"set --config.train.batch_size to a multiple of {n_dev}")

    train_lines = None
    def get_train_lines():
        nonlocal train_lines
        if train_lines is None:
            train_lines = corpora.load_lines(config.data, config.data.train_split)
        return train_lines
    tokenizer = load_tokenizer_for(config, workdir, get_train_lines)
    stream = load_stream(config, workdir, config.data.train_split, tokenizer,
                         None if train_lines is None else train_lines)

    model = build_model(config, tokenizer.vocab_size)
    model.scheme.check_length(tc.seq_len)
    graphdef, params = nnx.split(model)
    tx = make_optimizer(tc)
    opt_state = tx.init(params)
    mngr = checkpoints.manager(workdir)
    start = 0
    if mngr.latest_step() is not None:
        params, opt_state, meta = checkpoints.restore(mngr, params, opt_state)
        start = int(meta["step"])
        log.info("resuming %s from step %d", workdir, start)
    _truncate_metrics(workdir / "metrics.jsonl", start)

    mesh = data_mesh()
    replicated, batch_sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params, opt_state = jax.device_put((params, opt_state), replicated)
    step_fn = make_train_step(graphdef, tx, config.seed + 1)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    end = tc.steps if max_steps is None else min(tc.steps, start + max_steps)
    tokens_per_step = tc.batch_size * tc.seq_len

    def save(step):
        checkpoints.save(mngr, step, params, opt_state,
                         {"step": step, "data_position": step, "seed": config.seed})

    step, pending, last = start, [], time.perf_counter()
    bar = tqdm(total=tc.steps, initial=start, desc=f"train {config.posenc.name} L={tc.seq_len}",
               unit="step", dynamic_ncols=True, disable=None)
    try:
        with open(workdir / "metrics.jsonl", "a") as metrics_file:
            while step < end:
                inputs, targets = corpora.train_batch(stream, step, tc.batch_size, tc.seq_len, config.seed)
                inputs, targets = jax.device_put((inputs, targets), batch_sharded)
                params, opt_state, metrics = step_fn(params, opt_state, inputs, targets, step)
                pending.append(metrics)
                step += 1
                bar.update(1)
                if step % tc.log_every == 0 or step == end:
                    values = jax.device_get(pending)
                    now = time.perf_counter()
                    record = {"step": step,
                              "loss": float(np.mean([m["loss"] for m in values])),
                              "grad_norm": float(np.mean([m["grad_norm"] for m in values])),
                              "lr": lr_at(tc, step - 1),
                              "tokens_per_s": len(values) * tokens_per_step / (now - last)}
                    metrics_file.write(json.dumps(record) + "\n")
                    metrics_file.flush()
                    bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
                    pending, last = [], now
                    if not np.isfinite(record["loss"]):
                        raise FloatingPointError(f"loss is {record['loss']} at step {step}; lower train.lr")
                if step % tc.checkpoint_every == 0 or step == end:
                    save(step)
    except KeyboardInterrupt:
        bar.close()
        if step > start and mngr.latest_step() != step:
            save(step)
        log.warning("interrupted at step %d; checkpoint saved, the same command resumes", step)
        raise
    bar.close()
    return {"workdir": str(workdir), "step": step, "done": step >= tc.steps, "params": n_params}


def is_trained(workdir: pathlib.Path, config) -> bool:
    mngr_dir = pathlib.Path(workdir) / "checkpoints"
    if not mngr_dir.exists():
        return False
    latest = checkpoints.manager(workdir).latest_step()
    return latest is not None and latest >= config.train.steps
