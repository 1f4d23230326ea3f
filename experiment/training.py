"""Training: config -> data -> model -> AdamW / NAG with warm-up + cosine -> checkpoints -> evaluation.

The hot loop uses the functional NNX pattern: `nnx.split` once, a plain `jax.jit` step that
merges, computes the loss, and returns new state, with buffer donation. `train.batch_size` is the
global update, as papers state it; `train.device_batch_tokens` caps what one device computes at
once, and the update is then accumulated over micro-steps inside the one jitted step. Batches are
split over every device of the job (experiment/sharding.py: a data x fsdp mesh), parameters and
optimizer state over the FSDP axis (`mesh.fsdp`, 1 = replicated).
"""
from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import signal
import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

import corpora
from experiment import accelerator, checkpoints, config_util, distributed, init_from, sharding
from experiment.run import RunDir
from experiment.tensorboard import EventWriter
from models import DecoderLM, ModelConfig

log = logging.getLogger(__name__)


ConfigError = config_util.ConfigError


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


def micro_batching(batch_size: int, seq_len: int, device_batch_tokens: int, devices: int) -> int:
    """Micro-steps per update: the fewest that divide each device's share of the batch into pieces of
    at most `device_batch_tokens` tokens (0: no cap, one step)."""
    if batch_size < 1:
        raise ConfigError(f"train.batch_size must be positive, got {batch_size}")
    if batch_size % devices:
        raise ConfigError(f"train.batch_size={batch_size} is not divisible by the {devices} devices; "
                          f"set --config.train.batch_size to a multiple of {devices}")
    rows = batch_size // devices
    if device_batch_tokens <= 0:
        return 1
    if device_batch_tokens < seq_len:
        raise ConfigError(f"train.device_batch_tokens={device_batch_tokens} is less than one sequence "
                          f"(train.seq_len={seq_len}); set it to at least {seq_len}")
    steps = -(-rows // (device_batch_tokens // seq_len))
    while rows % steps:
        steps += 1
    return steps


# train.dropout_rng -> jax.random.key's impl; runs saved without the option used threefry.
DROPOUT_RNGS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}


def make_train_step(graphdef, tx, dropout_seed: int, *, micro_steps: int = 1,
                    per_example_keys: bool = False, grad_shardings=None, rng_impl: str = "threefry",
                    per_device_mesh: jax.sharding.Mesh | None = None):
    """The jitted update. With `micro_steps` = k > 1 the batch is split into k micro-batches (rows
    i, k + i, 2k + i, ... form micro-batch i, so each device keeps its own rows) whose gradients are
    summed in a `lax.scan`; the loss, gradient norm, clipping and update are those of the whole batch.
    `per_example_keys`: every row draws its dropout (and sampled positions) from its own key,
    fold_in(step key, row), so the masks do not depend on how the batch is split.
    `grad_shardings` (the parameters' shardings): parameters sharded over an FSDP axis are gathered
    whole for the forward and backward pass (left to itself, XLA's propagation splits the products
    over the sharded dimension instead and all-reduces activations), and gradients are
    reduce-scattered back to the parameters' shards.
    `rng_impl` (a DROPOUT_RNGS name): the PRNG of the dropout keys. threefry is the same on every
    backend; rbg / unsafe_rbg draw bits with XLA's RngBitGenerator (cheaper on accelerators, the
    bits depend on the backend; unsafe_rbg also splits keys with it).
    `per_device_mesh`: the forward and backward pass run on each device's rows by itself
    (`shard_map` over the batch axes: parameters whole on every device, loss and gradients averaged
    across devices), for kernels XLA cannot partition (`uses_per_device_step`). The same numbers as
    without it, up to rounding: rows and their dropout keys are the same."""
    if rng_impl not in DROPOUT_RNGS:
        raise ConfigError(f"unknown train.dropout_rng {rng_impl!r}; valid: {', '.join(DROPOUT_RNGS)}")
    # parameters gathered whole for the pass (per device: they enter shard_map whole, in_specs P())
    gathered = None if grad_shardings is None or per_device_mesh is not None else jax.tree.map(
        lambda s: NamedSharding(s.mesh, P()), grad_shardings)

    def loss_and_grads(params, inputs_BxT, targets_BxT, rows_B, step_key):
        def loss_fn(p):
            if gathered is not None:
                p = jax.lax.with_sharding_constraint(p, gathered)
            model = nnx.merge(graphdef, p)
            if not per_example_keys:
                return model.token_nll(inputs_BxT, targets_BxT, dropout_key=step_key).mean()
            keys_B = jax.vmap(lambda r: jax.random.fold_in(step_key, r))(rows_B)
            row_nll = lambda x, y, k: model.token_nll(x[None], y[None], dropout_key=k)[0]
            return jax.vmap(row_nll)(inputs_BxT, targets_BxT, keys_B).mean()
        return jax.value_and_grad(loss_fn)(params)

    if per_device_mesh is not None:
        axes = sharding.BATCH_AXES
        whole_batch = loss_and_grads

        def on_each_device(params, inputs_BxT, targets_BxT, rows_B, step_key):
            return jax.lax.pmean(whole_batch(params, inputs_BxT, targets_BxT, rows_B, step_key), axes)
        # check_vma off: Pallas' outputs carry no varying-axes types; pmean makes the results replicated
        loss_and_grads = jax.shard_map(on_each_device, mesh=per_device_mesh, check_vma=False,
                                       in_specs=(P(), P(axes), P(axes), P(axes), P()), out_specs=P())

    def train_step(params, opt_state, inputs_BxT, targets_BxT, step):
        step_key = jax.random.fold_in(jax.random.key(dropout_seed, impl=DROPOUT_RNGS[rng_impl]), step)
        rows_B = jnp.arange(inputs_BxT.shape[0], dtype=jnp.int32)
        if micro_steps == 1:
            loss, grads = loss_and_grads(params, inputs_BxT, targets_BxT, rows_B, step_key)
        else:
            def split(x):  # B x ... -> k x B/k x ...
                return jnp.swapaxes(x.reshape(-1, micro_steps, *x.shape[1:]), 0, 1)

            def accumulate(total, micro):
                loss, grads = loss_and_grads(params, *micro, step_key)
                if grad_shardings is not None:
                    grads = jax.lax.with_sharding_constraint(grads, grad_shardings)
                return jax.tree.map(jnp.add, total, (loss, grads)), None

            zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
            (loss, grads), _ = jax.lax.scan(accumulate, zero,
                                            (split(inputs_BxT), split(targets_BxT), split(rows_B)))
            loss, grads = jax.tree.map(lambda x: x / micro_steps, (loss, grads))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return jax.jit(train_step, donate_argnums=(0, 1))


def uses_per_device_step(model_cfg, scheme, devices: int) -> bool:
    """Whether training on `devices` devices runs its forward and backward pass per device (see
    make_train_step): where the Pallas attention kernel runs compiled (GPU), which has no rule for
    XLA to partition it, explicitly (model.attention=pallas) or as `auto`'s choice."""
    from models import pallas_attention
    if devices < 2 or pallas_attention.interpreted():
        return False
    kind, positions = model_cfg.get("attention", "auto"), jnp.zeros((1, 1), jnp.int32)
    return kind == "pallas" or (kind == "auto" and pallas_attention.supports(scheme, positions, positions))


def is_stochastic(model_cfg, scheme) -> bool:
    """Whether a training step draws random numbers (dropout, sampled positions)."""
    rates = (model_cfg.get("dropout", 0), model_cfg.get("attention_dropout", 0),
             model_cfg.get("activation_dropout", 0))
    return any(r > 0 for r in rates) or bool(scheme.samples_positions)


def init_state(config, vocab_size: int, tx, mesh):
    """(graphdef, params, opt_state, param shardings): the model initialised straight into its
    shardings (a jitted init), so no device ever holds more than its share."""
    abstract = nnx.eval_shape(lambda: build_model(config, vocab_size))
    abstract.scheme.check_length(config.train.seq_len)
    graphdef, abstract_params = nnx.split(abstract)
    param_shards = sharding.param_shardings(abstract_params, mesh)
    params = jax.jit(lambda: nnx.split(build_model(config, vocab_size))[1], out_shardings=param_shards)()
    opt_shards = sharding.optimizer_shardings(tx, jax.eval_shape(tx.init, params), param_shards, mesh)
    opt_state = jax.jit(tx.init, out_shardings=opt_shards)(params)
    return graphdef, params, opt_state, param_shards, abstract.scheme


# --- the run ----------------------------------------------------------------------------------

def _load_data(config, run: RunDir):
    """(tokenizer, train stream): the writer builds and caches them in the run directory, the
    other processes read its files."""
    if distributed.is_writer():
        cache = {}

        def train_lines():
            if "lines" not in cache:
                cache["lines"] = corpora.load_lines(config.data, config.data.train_split)
            return cache["lines"]
        tokenizer = run.tokenizer(config.data, train_lines)
        stream, _ = run.stream(config.data, config.data.train_split, tokenizer, cache.get("lines"))
    distributed.barrier("lengthx_data")
    if not distributed.is_writer():
        tokenizer = run.tokenizer(config.data, write=False)
        stream, _ = run.stream(config.data, config.data.train_split, tokenizer, write=False)
    return tokenizer, stream


def _scalar(value: int, mesh) -> jax.Array:
    """A replicated int32 scalar that every process of the job agrees on."""
    return jax.make_array_from_callback((), NamedSharding(mesh, P()), lambda _: np.int32(value))


@contextlib.contextmanager
def _interrupts_between_steps():
    """Ctrl-C (SIGINT) takes effect between steps: a step has donated its inputs' buffers once it
    is dispatched, so stopping inside it would leave nothing to save. Yields `requested()`; a
    second Ctrl-C stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    requested = []

    def handler(signum, frame):
        if requested:
            raise KeyboardInterrupt
        requested.append(True)
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(requested)
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _out_of_memory_explained(step_shape: dict):
    """An out-of-memory error from XLA (compiling or running) becomes a ConfigError naming the
    options that lower the step's memory."""
    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        raise ConfigError(f"the device ran out of memory ({str(e).splitlines()[0][:160]}); "
                          + accelerator.memory_options(**step_shape)) from e


def train(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
          max_steps: int | None = None) -> dict:
    """Train (or resume) the run in `workdir`. `max_steps` stops after that many steps in this call
    (for time-sliced jobs); Ctrl-C saves a checkpoint first. Returns a summary dict.

    The run directory is locked for the whole call (a second process on it is refused). A new run's
    config.json is written only once the config, the data and the model have been checked, so a
    first attempt that fails leaves nothing that blocks the corrected command."""
    config = config_util.resolve(config)
    run = RunDir(workdir)
    if max_steps is not None and max_steps < 0:
        raise ConfigError(f"--max_steps must be >= 0 (0: set the run up without training), got {max_steps}")
    mesh = sharding.mesh_from_config(config)
    tc = config.train
    micro_steps = micro_batching(tc.batch_size, tc.seq_len, tc.get("device_batch_tokens", 0), mesh.size)
    corpora.check_splits(config.data, sorted({config.data.train_split, config.eval.split}))
    with run.locked("training") if distributed.is_writer() else contextlib.nullcontext():
        fresh = run.latest_step() is None
        base = init_from.base_of(config) if fresh else None
        if distributed.is_writer():
            run.check_config(config)
            run.clear_leftovers()
            if base is not None:
                init_from.take_tokenizer(base, run)
        distributed.barrier("lengthx_workdir")
        tokenizer, stream = _load_data(config, run)
        tx = make_optimizer(tc)
        state = init_state(config, tokenizer.vocab_size, tx, mesh)  # checks the model and its length
        if float(config.data.get("passkey_fraction", 0.0)):  # the task fits L and the vocabulary
            try:
                corpora.passkey_example(tokenizer, tc.seq_len, 0.5, 0, int(config.data.get("passkey_digits", 4)))
            except corpora.PasskeyError as e:
                raise ConfigError(f"data.passkey_fraction: {e}") from None
        if base is not None:  # the base's parameters, a fresh optimizer (its state does not depend on them)
            params, origin = init_from.load_base_params(config, base, state[1], build_model, tokenizer.vocab_size)
            state = (state[0], params, *state[2:])
            log.info("starting from %s at step %d", origin["workdir"], origin["step"])
        if distributed.is_writer():
            run.save_config(config)
            if base is not None:
                init_from.record(run, origin)
        return _train_loop(config, run, mesh, micro_steps, tokenizer, stream, tx, state, max_steps)


def _train_loop(config, run: RunDir, mesh, micro_steps, tokenizer, stream, tx, state, max_steps):
    tc = config.train
    graphdef, params, opt_state, param_shards, scheme = state
    writer = distributed.is_writer()
    mngr = run.manager()
    start = 0
    if run.latest_step() is not None:
        params, opt_state, meta = run.restore(params, opt_state, drop_damaged=writer)
        start = int(meta["step"])
        log.info("resuming %s from step %d", run.path, start)
    if writer:
        run.truncate_metrics(start)

    step_fn = make_train_step(graphdef, tx, config.seed + 1, micro_steps=micro_steps,
                              per_example_keys=is_stochastic(config.model, scheme),
                              grad_shardings=param_shards, rng_impl=tc.get("dropout_rng", "threefry"),
                              per_device_mesh=mesh if uses_per_device_step(config.model, scheme, mesh.size) else None)
    batch_shard = sharding.batch_sharding(mesh)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    end = tc.steps if max_steps is None else min(tc.steps, start + max_steps)
    tokens_per_step = tc.batch_size * tc.seq_len
    fsdp = mesh.shape[sharding.FSDP]
    advice_args = dict(micro_rows=tc.batch_size // micro_steps // mesh.size, micro_steps=micro_steps,
                       seq_len=tc.seq_len, fsdp=fsdp, devices=mesh.size)
    log.info("%s: %.1fM parameters; update of %d x %d tokens = %d micro-step(s) of %d sequences per device "
             "on %d device(s) (mesh data=%d x fsdp=%d)", config.posenc.name, n_params / 1e6, tc.batch_size,
             tc.seq_len, micro_steps, advice_args["micro_rows"], mesh.size, mesh.shape[sharding.DATA], fsdp)
    flops_per_token = accelerator.training_flops_per_token(
        ModelConfig.from_config(config.model, tokenizer.vocab_size), tc.seq_len, tokenizer.vocab_size)
    peak = accelerator.peak_tflops()

    passkey_fraction = float(config.data.get("passkey_fraction", 0.0))

    def batch(step):
        def read(lo, hi):
            inputs, targets = corpora.train_batch(stream, step, tc.batch_size, tc.seq_len, config.seed,
                                                  rows=slice(lo, hi))
            if passkey_fraction:  # some rows become passkey examples (corpora/passkey.py)
                inputs, targets = corpora.mix_passkey(inputs, targets, tokenizer, passkey_fraction, step, config.seed,
                                                      int(config.data.get("passkey_digits", 4)), rows=slice(lo, hi))
            return inputs, targets
        return sharding.global_batch(batch_shard, (tc.batch_size, tc.seq_len), read)

    if start < end:  # compile first, and refuse a step that cannot fit before running it
        with _out_of_memory_explained(advice_args):
            compiled = step_fn.lower(params, opt_state, *batch(start), _scalar(start, mesh)).compile()
        advice = accelerator.memory_advice(accelerator.program_bytes(compiled),
                                           accelerator.device_memory_limit(), **advice_args)
        if advice:
            raise ConfigError(advice)
        step_fn = compiled

    def save(step):
        checkpoints.save(mngr, step, params, opt_state,
                         {"step": step, "data_position": step, "seed": config.seed})

    step, pending, last = start, [], time.perf_counter()
    bar = tqdm(total=tc.steps, initial=start, desc=f"train {config.posenc.name} L={tc.seq_len}",
               unit="step", dynamic_ncols=True, disable=None if writer else True)
    plain_lines = writer and bar.disable  # no terminal: the loss goes to the log instead of the bar

    def log_pending(metrics_file):
        """Write the metrics of the steps since the last line (one record)."""
        nonlocal pending, last
        values = jax.device_get(pending)
        now = time.perf_counter()
        tokens_per_s = len(values) * tokens_per_step / (now - last)
        memory_key, memory_gb = accelerator.peak_memory_gb()
        record = {"step": step,
                  "loss": float(np.mean([m["loss"] for m in values])),
                  "grad_norm": float(np.mean([m["grad_norm"] for m in values])),
                  "lr": lr_at(tc, step - 1),
                  "tokens_per_s": tokens_per_s,
                  **({"mfu": flops_per_token * tokens_per_s / (peak * 1e12 * mesh.size)} if peak else {}),
                  memory_key: round(memory_gb, 3)}
        if writer:
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
            board.scalars({f"train/{k}": v for k, v in record.items() if k != "step"}, step)
        bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{tokens_per_s:.0f}",
                        **({"mfu": f"{record['mfu']:.1%}"} if "mfu" in record else {}), mem=f"{memory_gb:.1f}GB")
        if plain_lines:
            log.info("step %d/%d  loss %.4f  lr %.3g  %.0f tokens/s%s  %.2f GB", step, tc.steps, record["loss"],
                     record["lr"], tokens_per_s, f"  mfu {record['mfu']:.1%}" if "mfu" in record else "", memory_gb)
        pending, last = [], now
        if not np.isfinite(record["loss"]):
            raise FloatingPointError(f"loss is {record['loss']} at step {step}; lower train.lr")

    with (open(run.metrics_path, "a") if writer else contextlib.nullcontext()) as metrics_file, \
            (EventWriter(run.tensorboard_dir) if writer else contextlib.nullcontext()) as board:
        try:
            with _out_of_memory_explained(advice_args), _interrupts_between_steps() as interrupted:
                while step < end:
                    if interrupted():
                        raise KeyboardInterrupt
                    params, opt_state, metrics = step_fn(params, opt_state, *batch(step), _scalar(step, mesh))
                    pending.append(metrics)
                    step += 1
                    bar.update(1)
                    if step % tc.log_every == 0 or step == end:
                        log_pending(metrics_file)
                    if step % tc.checkpoint_every == 0 or step == end:
                        save(step)
        except KeyboardInterrupt:
            bar.close()
            if pending:
                log_pending(metrics_file)  # the steps since the last line are kept with the checkpoint
            if step > start and mngr.latest_step() != step:
                save(step)
            log.warning("interrupted at step %d; checkpoint saved, the same command resumes", step)
            raise
    bar.close()
    if step < tc.steps:
        log.info("stopped at step %d of %d (--max_steps=%d); the run is unfinished: the same command "
                 "resumes it", step, tc.steps, max_steps)
    return {"workdir": str(run.path), "step": step, "done": step >= tc.steps, "params": n_params,
            "micro_steps": micro_steps}


def is_trained(workdir: pathlib.Path, config) -> bool:
    latest = RunDir(workdir).latest_step()
    return latest is not None and latest >= config.train.steps
