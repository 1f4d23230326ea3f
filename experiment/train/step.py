"""The jitted update: micro-steps accumulated inside one step, per-row dropout keys, FSDP's gather and
reduce-scatter, and (for kernels XLA cannot partition) the forward and backward pass per device."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from experiment.config import ConfigError
from experiment.runtime import sharding
from models.attention.choice import training_calls

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
    across devices), for kernels XLA cannot partition (models/attention/choice.py: `runs_per_device`). The same numbers as
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
            # attention's calls are a training step's (its kernel search and race): choice.training_calls
            with training_calls(inputs_BxT.shape[0], per_row=per_example_keys):
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


def is_stochastic(model_cfg, scheme) -> bool:
    """Whether a training step draws random numbers (dropout, sampled positions)."""
    rates = (model_cfg.dropout, model_cfg.attention_dropout, model_cfg.activation_dropout)
    return any(r > 0 for r in rates) or scheme.traits.samples_positions
