"""The training loop: config -> data -> model -> optimizer -> steps -> checkpoints.

The hot loop uses the functional NNX pattern: `nnx.split` once, a plain `jax.jit` step that
merges, computes the loss and returns new state, with buffer donation (experiment/train/step.py).
`train.batch_size` is the global update, as papers state it; `train.device_batch_tokens` caps what
one device computes at once, and the update is then accumulated over micro-steps inside the one
jitted step. Batches are split over every device of the job (experiment/runtime/sharding.py: a
data x fsdp mesh), parameters and optimizer state over the FSDP axis (`mesh.fsdp`, 1 = replicated).
A run is resumed from its newest readable checkpoint and sees the same batches it would have seen.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
from typing import Callable, NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import corpora
from experiment.config import Config, ConfigError, resolve, typed
from experiment.model import abstract_model, build_model
from experiment.runtime import accelerator, distributed, interrupts, sharding
from experiment.store import checkpoints
from experiment.store.run import RunDir, opened
from experiment.train import init_from
from experiment.train.metrics import MetricsLog, Throughput, TrainingDiverged
from experiment.train.optimizer import make_optimizer
from experiment.train.step import is_stochastic, make_train_step, micro_batching
from models.attention import choice

log = logging.getLogger(__name__)


class TrainState(NamedTuple):
    graphdef: nnx.GraphDef
    params: nnx.State
    opt_state: object
    param_shardings: object
    scheme: object  # the positional scheme (abstract), for what it needs of the step


def init_state(config: Config, vocab_size: int, tx, mesh) -> TrainState:
    """The model initialised straight into its shardings (a jitted init), so no device ever holds
    more than its share, and its optimizer state likewise."""
    abstract = abstract_model(config, vocab_size)
    abstract.scheme.check_length(config.train.seq_len)
    graphdef, abstract_params = nnx.split(abstract)
    param_shards = sharding.param_shardings(abstract_params, mesh)
    params = jax.jit(lambda: nnx.split(build_model(config, vocab_size))[1], out_shardings=param_shards)()
    opt_shards = sharding.optimizer_shardings(tx, jax.eval_shape(tx.init, params), param_shards, mesh)
    opt_state = jax.jit(tx.init, out_shardings=opt_shards)(params)
    return TrainState(graphdef, params, opt_state, param_shards, abstract.scheme)


def train(config, workdir: str | pathlib.Path | RunDir, *, max_steps: int | None = None) -> dict:
    """Train (or resume) the run in `workdir`. `max_steps` stops after that many steps in this call
    (for time-sliced jobs); Ctrl-C saves a checkpoint first. Returns a summary dict.

    The run directory is held for the whole call (a second process on it is refused). A new run's
    config.json is written only once the config, the data and the model have been checked, so a
    first attempt that fails leaves nothing that blocks the corrected command."""
    config = resolve(config)
    if max_steps is not None and max_steps < 0:
        raise ConfigError(f"--max_steps must be >= 0 (0: set the run up without training), got {max_steps}")
    mesh = sharding.mesh_from_config(config)
    tc = config.train
    micro_steps = micro_batching(tc.batch_size, tc.seq_len, tc.device_batch_tokens, mesh.size)
    corpora.check_splits(config.data, sorted({config.data.train_split, config.eval.split}))
    with opened(workdir, "training") as run:
        tokenizer, stream, tx, state = _set_up(config, run, mesh)
        interrupts.check(lambda: _kept(run, "interrupted before training started"))
        return _train_loop(config, run, _Setup(mesh, micro_steps, tokenizer, stream, tx), state, max_steps)


def _kept(run: RunDir, when: str) -> str:
    """What an interruption `when` leaves: the newest checkpoint, or nothing of the run."""
    step = run.latest_step()
    if step is None:
        return (f"{when}; no checkpoint exists yet (the run is not saved): the same command (or a corrected "
                f"one) starts it over")
    return f"{when}; the checkpoint at step {step} is kept: the same command resumes from it"


class _Setup(NamedTuple):
    mesh: jax.sharding.Mesh
    micro_steps: int
    tokenizer: object
    stream: np.ndarray
    tx: object


def _set_up(config: Config, run: RunDir, mesh):
    """(tokenizer, train stream, optimizer, initial state): checked before config.json is written."""
    fresh = run.latest_step() is None
    base = init_from.base_of(config) if fresh else None
    if run.writer:
        run.check_config(config)
        run.clear_leftovers(config)
        if base is not None:
            init_from.take_tokenizer(base, run)
    distributed.barrier("lengthx_workdir")
    with interrupts.immediate(_kept(run, "interrupted while reading the data")):  # writes files whole only
        tokenizer, stream = _load_data(config, run)
    if len(stream) < config.train.seq_len + 2:  # corpora.train_batch's windows of L + 1 tokens, at two starts
        raise ConfigError(f"the training split ({config.data.train_split}) has {len(stream):,} tokens, too few for "
                          f"train.seq_len={config.train.seq_len}; set --config.train.seq_len={max(1, len(stream) - 2)} "
                          f"or less, or train on more text")
    tx = make_optimizer(config.train)
    state = init_state(config, tokenizer.vocab_size, tx, mesh)  # checks the model and its length
    if config.data.passkey_fraction:  # the task fits L and the vocabulary
        try:
            corpora.passkey_example(tokenizer, config.train.seq_len, 0.5, 0, config.data.passkey_digits)
        except corpora.PasskeyError as e:
            raise ConfigError(f"data.passkey_fraction: {e}") from None
    if base is not None:  # the base's parameters, a fresh optimizer (its state does not depend on them)
        params, origin = init_from.load_base_params(config, base, state.params, tokenizer.vocab_size)
        state = state._replace(params=params)
        log.info("starting from %s at step %d", origin["workdir"], origin["step"])
    if run.writer:
        run.save_config(config)
        if base is not None:
            run.record_origin(origin)
    return tokenizer, stream, tx, state


def _load_data(config: Config, run: RunDir):
    """(tokenizer, train stream): the writer builds and caches them in the run directory, the
    other processes read its files."""
    if run.writer:
        cache = {}

        def train_lines():
            if "lines" not in cache:
                cache["lines"] = corpora.load_lines(config.data, config.data.train_split)
            return cache["lines"]
        tokenizer = run.tokenizer(config.data, train_lines)
        stream, _ = run.stream(config.data, config.data.train_split, tokenizer, cache.get("lines"))
    distributed.barrier("lengthx_data")
    if not run.writer:
        tokenizer = run.tokenizer(config.data, write=False)
        stream, _ = run.stream(config.data, config.data.train_split, tokenizer, write=False)
    return tokenizer, stream


def _scalar(value: int, mesh) -> jax.Array:
    """A replicated int32 scalar that every process of the job agrees on."""
    return jax.make_array_from_callback((), NamedSharding(mesh, P()), lambda _: np.int32(value))


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


def _batches(config: Config, tokenizer, stream: np.ndarray, mesh):
    """step -> the global (inputs, targets) of that step, each process reading only its rows."""
    tc, data = config.train, config.data
    batch_shard = sharding.batch_sharding(mesh)

    def batch(step):
        def read(lo, hi):
            inputs, targets = corpora.train_batch(stream, step, tc.batch_size, tc.seq_len, config.seed,
                                                  rows=slice(lo, hi))
            if data.passkey_fraction:  # some rows become passkey examples (corpora/passkey.py)
                inputs, targets = corpora.mix_passkey(inputs, targets, tokenizer, data.passkey_fraction, step,
                                                      config.seed, data.passkey_digits, rows=slice(lo, hi))
            return inputs, targets
        return sharding.global_batch(batch_shard, (tc.batch_size, tc.seq_len), read)
    return batch


def _train_loop(config: Config, run: RunDir, setup: _Setup, state: TrainState, max_steps: int | None) -> dict:
    """Resume from the newest readable checkpoint, compile the step (refusing one that cannot fit),
    then step, log every train.log_every and checkpoint every train.checkpoint_every steps; Ctrl-C
    saves a checkpoint with the steps logged since the last line. Returns the summary."""
    tc, mesh, micro_steps = config.train, setup.mesh, setup.micro_steps
    params, opt_state = state.params, state.opt_state
    start = 0
    if run.latest_step() is not None:
        params, opt_state, meta = checkpoints.restore(run, params, opt_state, drop_damaged=run.writer)
        start = int(meta["step"])
        log.info("resuming %s from step %d", run.path, start)
    if run.writer:
        run.truncate_metrics(start)
    per_device = choice.runs_per_device(config.model, state.scheme, mesh.size)
    step_fn = make_train_step(state.graphdef, setup.tx, config.seed + 1, micro_steps=micro_steps,
                              per_example_keys=is_stochastic(config.model, state.scheme),
                              grad_shardings=state.param_shardings, rng_impl=tc.dropout_rng,
                              per_device_mesh=mesh if per_device else None)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    end = tc.steps if max_steps is None else min(tc.steps, start + max_steps)
    fsdp = mesh.shape[sharding.FSDP]
    advice_args = dict(micro_rows=tc.batch_size // micro_steps // mesh.size, micro_steps=micro_steps,
                       seq_len=tc.seq_len, fsdp=fsdp, devices=mesh.size)
    log.info("%s: %.1fM parameters; update of %d x %d tokens = %d micro-step(s) of %d sequences per device "
             "on %d device(s) (mesh data=%d x fsdp=%d)", config.posenc.name, n_params / 1e6, tc.batch_size,
             tc.seq_len, micro_steps, advice_args["micro_rows"], mesh.size, mesh.shape[sharding.DATA], fsdp)
    vocab = setup.tokenizer.vocab_size
    throughput = Throughput(tc.batch_size * tc.seq_len, accelerator.training_flops_per_token(
        config.model_for(vocab), tc.seq_len, vocab), accelerator.peak_tflops(), mesh.size)
    batch = _batches(config, setup.tokenizer, setup.stream, mesh)

    if start < end:  # compile first, and refuse a step that cannot fit before running it
        choice.PICKED.clear()
        with _out_of_memory_explained(advice_args):
            compiled = step_fn.lower(params, opt_state, *batch(start), _scalar(start, mesh)).compile()
        throughput = dataclasses.replace(throughput, attention=choice.picked())
        log.info("attention (model.attention=%s): %s", config.model.attention, throughput.attention)
        interrupts.check(lambda: _kept(run, "interrupted while compiling the training step"))
        advice = accelerator.memory_advice(accelerator.program_bytes(compiled),
                                           accelerator.device_memory_limit(), **advice_args)
        if advice:
            raise ConfigError(advice)
        step_fn = compiled

    mngr = checkpoints.manager_of(run)

    def save(step):
        metrics.check_finite(step)  # a diverged step is never saved
        checkpoints.save(mngr, step, params, opt_state, {"step": step, "data_position": step, "seed": config.seed})

    step = start
    stop_requested = _stop_requested(start, min(tc.log_every, AGREE_EVERY))
    with MetricsLog(run, config, start, throughput) as metrics:
        try:  # Ctrl-C takes effect between steps: a dispatched step has donated its inputs' buffers
            with _out_of_memory_explained(advice_args), interrupts.deferred():
                while step < end:
                    if stop_requested(step):  # the message is written below, once the checkpoint is
                        raise interrupts.Interrupted("")
                    params, opt_state, step_metrics = step_fn(params, opt_state, *batch(step), _scalar(step, mesh))
                    metrics.add(step_metrics)
                    step += 1
                    if step % tc.log_every == 0 or step == end:
                        metrics.log(step)
                    if step % tc.checkpoint_every == 0 or step == end:
                        save(step)
                if stop_requested(step, last=True):  # pressed during the last step or checkpoint write
                    raise interrupts.Interrupted("")
        except KeyboardInterrupt:  # Interrupted at a safe point, or raised by code between two steps
            metrics.bar.close()
            if metrics.pending:
                metrics.log(step)  # the steps since the last line are kept with the checkpoint
            if step > start and mngr.latest_step() != step:
                save(step)
            if step == start:
                raise interrupts.Interrupted(_kept(run, "interrupted before the first step")) from None
            then = ("training is complete: the same command goes on to what follows it (evaluation)"
                    if step >= tc.steps else "the same command resumes from it")
            raise interrupts.Interrupted(f"interrupted at step {step} of {tc.steps}; checkpoint saved at step "
                                         f"{step}: {then}") from None
        except TrainingDiverged as e:
            kept = run.latest_step()
            raise TrainingDiverged(
                f"{e}; no checkpoint was written, so the corrected command starts the run over (the same --workdir)"
                if kept is None else f"{e}; the checkpoints up to step {kept} are kept, but a run's train.lr is "
                f"fixed once it has one: train with a lower train.lr in a new --workdir") from None
    if step < tc.steps:
        log.info("stopped at step %d of %d (--max_steps=%d); the run is unfinished: the same command "
                 "resumes it", step, tc.steps, max_steps)
    return {"workdir": str(run.path), "step": step, "done": step >= tc.steps, "params": n_params,
            "micro_steps": micro_steps}


AGREE_EVERY = 10  # steps between the processes' agreements on a Ctrl-C (below)


def _stop_requested(start: int, every: int) -> Callable[..., bool]:
    """Whether to stop before `step` for a Ctrl-C. One process: at once. Several processes (a Ctrl-C
    may reach only some of them): they agree, every `every` steps from `start` and after the last
    one, so that all stop at the same step and write its checkpoint together. An agreement is one
    tiny collective that waits for the steps before it, so it is made only every `every` steps
    (min(log_every, AGREE_EVERY)): one pause of the host in that many steps."""
    if jax.process_count() == 1:
        return lambda step, last=False: interrupts.requested()
    return lambda step, last=False: ((last or (step - start) % every == 0)
                                     and distributed.any_process(interrupts.requested()))


def is_trained(workdir: str | pathlib.Path | RunDir, config) -> bool:
    """Whether the run has a checkpoint at `config.train.steps` or later."""
    run = workdir if isinstance(workdir, RunDir) else RunDir(workdir)
    latest = run.latest_step()
    return latest is not None and latest >= typed(config).train.steps
