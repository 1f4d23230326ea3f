"""The Pallas attention kernel (models/attention/pallas.py), run in Pallas' interpreter on CPU:
equal to dense attention, forward and gradients (inputs and the bias's learned parameters), for
every scheme that provides `bias_fn`, for rotations without a bias, and with dropout."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models.attention.dense import NO_DROPOUT as NO_DROP, Dropout, dense_attention
from models.attention import choice
from models.attention.launches import lowering_for_a_gpu
from models.attention.pallas import Launch, pallas_attention
from models.attention.pallas_kernels import keep_mask
from models.attention.paths import PATHS, CallSpec
from models.config import ModelConfig

B, T, H, K, BLOCK = 2, 20, 2, 8, 8  # 3 blocks of 8 (the last one padded): diagonal, off-diagonal, padding
# small option values keep the interpreter's compile time down; the formulas are the same
SMALL = {"t5": {"num_buckets": 12, "max_distance": 8},  # beyond max_distance one value; 12: a padded table
         "fire": {"hidden": 4, "threshold_init": 8.0}, "sandwich": {"dim": 8}}


def _scheme(name: str, train_length: int = 16):
    cfg = posenc.default_config(name)
    for key, value in SMALL.get(name, {}).items():
        cfg[name][key] = value
    dims = posenc.ModelDims(d_model=H * K, num_heads=H, head_dim=K, num_layers=1, train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, H, K)), jnp.float32) for _ in range(3))
    # rows at different offsets, with a gap: positions feed only the bias, the order is the index's
    pos = jnp.asarray(np.stack([np.arange(T), 5 + np.arange(T) + (np.arange(T) >= 9) * 3]), jnp.int32)
    return q, k, v, pos


# The schemes whose bias is a function of positions (bias_fn), named here rather than found by building
# every scheme at collection (~8 s in each test process); the test below builds them once and compares.
BIAS_SCHEMES = ["alibi", "fire", "kerple_log", "kerple_power", "sandwich", "t5"]


def test_every_additive_bias_scheme_provides_its_bias_as_a_function():
    assert [n for n in posenc.names() if _scheme(n).bias_fn() is not None] == BIAS_SCHEMES


@pytest.mark.parametrize("name", BIAS_SCHEMES)
def test_bias_function_equals_the_tile_bias(name):
    scheme = _scheme(name)
    _, _, _, pos = _inputs()
    probe = jnp.zeros((B, T, H, K), jnp.float32)
    np.testing.assert_allclose(scheme.bias_fn().dense(pos, pos),
                               np.broadcast_to(scheme.bias(probe, probe, pos, pos), (B, H, T, T)),
                               rtol=1e-5, atol=1e-5)


def _loss(attend, graphdef, state, q, k, v, pos):
    out = attend(q, k, v, pos, pos, nnx.merge(graphdef, state))
    return (out * jnp.sin(jnp.arange(out.size, dtype=jnp.float32).reshape(out.shape))).sum()


def _dense(q, k, v, q_pos, k_pos, scheme):
    return dense_attention(q, k, v, q_pos, k_pos, scheme, jnp.tril(jnp.ones((T, T), bool)))


def _kernel(q, k, v, q_pos, k_pos, scheme):
    return pallas_attention(q, k, v, q_pos, k_pos, scheme, launch=Launch(block=BLOCK, interpret=True))


@pytest.mark.parametrize("name", BIAS_SCHEMES + ["rope", "logn", "pope"])  # pope: q, k wider than v
def test_kernel_equals_dense_attention_forward_and_gradients(name):
    scheme = _scheme(name)
    q, k, v, pos = _inputs()
    graphdef, state = nnx.split(scheme)
    outs, grads = {}, {}
    for label, attend in (("dense", _dense), ("kernel", _kernel)):
        outs[label], grads[label] = jax.jit(jax.value_and_grad(
            lambda *a: _loss(attend, graphdef, *a), argnums=(0, 1, 2, 3)))(state, q, k, v, pos)
    np.testing.assert_allclose(outs["kernel"], outs["dense"], rtol=1e-5, atol=1e-5)
    flat_dense, flat_kernel = jax.tree.leaves(grads["dense"]), jax.tree.leaves(grads["kernel"])
    assert len(flat_dense) == len(flat_kernel) >= 3
    for want, got in zip(flat_dense, flat_kernel):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(jnp.abs(want).max())))
    if jax.tree.leaves(state):  # the learned parameters of the bias get (non-zero) gradients
        assert any(float(jnp.abs(g).max()) > 1e-4 for g in jax.tree.leaves(grads["kernel"][0]))


def test_kernel_dropout_is_the_dense_softmax_under_the_kernels_own_mask():
    scheme, rate = _scheme("kerple_log"), 0.3
    q, k, v, pos = _inputs(1)
    key = jax.random.key(7)
    seed = jax.random.bits(key, (1,), jnp.uint32)[0]
    b, h = np.meshgrid(np.arange(B), np.arange(H), indexing="ij")
    keep = jax.vmap(lambda b, h: keep_mask(seed, b, h, H, jnp.arange(T)[:, None], jnp.arange(T)[None, :], rate))(
        jnp.asarray(b.ravel()), jnp.asarray(h.ravel())).reshape(B, H, T, T)
    assert abs(float(keep.mean()) - (1 - rate)) < 0.05

    def reference(q, k, v, q_pos, k_pos, scheme):
        s = jnp.einsum("bthk,bshk->bhts", q, k) * K ** -0.5 + scheme.bias(q, k, q_pos, k_pos)
        p = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e30), axis=-1)
        return jnp.einsum("bhts,bshk->bthk", jnp.where(keep, p / (1 - rate), 0.0), v)

    def kernel(q, k, v, q_pos, k_pos, scheme):
        return pallas_attention(q, k, v, q_pos, k_pos, scheme, Dropout(rate, key),
                                Launch(block=BLOCK, interpret=True))

    graphdef, state = nnx.split(scheme)
    results = [jax.jit(jax.value_and_grad(lambda *a: _loss(attend, graphdef, *a), argnums=(0, 1, 2, 3)))(
        state, q, k, v, pos) for attend in (reference, kernel)]
    for want, got in zip(*(jax.tree.leaves(r) for r in results)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(jnp.abs(want).max())))


@pytest.mark.parametrize("name", ["t5"])  # a learned table read by distance, its gradient summed per bucket
def test_query_and_key_tiles_of_different_sizes_give_the_same_attention(name):
    """Issue 33: query tiles and key tiles of their own sizes (the diagonal then crosses tiles that
    are not square; dK / dV run over key tiles): forward and gradients equal square tiles', with and
    without dropout (its mask is a function of the absolute indices, not of the tiles)."""
    scheme, rate = _scheme(name), 0.2
    q, k, v, pos = _inputs(2)
    graphdef, state = nnx.split(scheme)
    results = {}
    backward = Launch(block=8, key_block=4)  # the backward kernels' own tiles (tuning searches them apart)
    for block, keys, own in ((8, None, None), (8, 4, None), (4, 8, backward)):
        for dropout in (NO_DROP, Dropout(rate, jax.random.key(3))):
            launch = Launch(block=block, key_block=keys, interpret=True).with_backward(own)

            def attend(q, k, v, q_pos, k_pos, scheme, dropout=dropout, launch=launch):
                return pallas_attention(q, k, v, q_pos, k_pos, scheme, dropout, launch)
            results[block, keys, dropout.rate] = jax.jit(jax.value_and_grad(
                lambda *a: _loss(attend, graphdef, *a), argnums=(0, 1, 2, 3)))(state, q, k, v, pos)
    for (block, keys, r), got in results.items():
        want = results[8, None, r]
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, float(jnp.abs(b).max())))
    assert Launch(block=8, key_block=4).label.startswith("blocks 8 x 4")
    mixed = Launch(block=4, key_block=8).with_backward(backward)
    assert mixed.label == "forward blocks 4 x 8, 4 warps, 2 stages; backward blocks 8 x 4, 4 warps, 2 stages"
    assert mixed.tiles == (4, 8, 8, 4) and Launch(8).with_backward(Launch(8)).backward is None


def test_a_lookup_table_of_any_size_is_padded_to_a_power_of_2():
    """Issue 46: T5 with a number of buckets that is no power of 2 failed at Triton's lowering (its
    arrays must be powers of 2); the table is padded inside the kernel, and its gradient cut back
    (the tests above run t5 with 12 buckets against dense attention), and the kernels lower for a GPU."""
    cfg = posenc.default_config("t5")
    cfg.t5.num_buckets = 48
    dims = posenc.ModelDims(d_model=H * 16, num_heads=H, head_dim=16, num_layers=1, train_length=64)
    graphdef, state = nnx.split(posenc.build(cfg, dims, rngs=nnx.Rngs(0)))
    x = jax.ShapeDtypeStruct((1, 64, H, 16), jnp.bfloat16)
    p = jnp.arange(64, dtype=jnp.int32)[None]
    loss = lambda state, q: pallas_attention(q, q, q, p, p, nnx.merge(graphdef, state),
                                             launch=Launch(16, interpret=False)).astype(jnp.float32).sum()
    with lowering_for_a_gpu():
        lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(state, x).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("xla.gpu.triton") == 3
    assert jax.tree.leaves(lowered.out_info[0])[0].shape == (48, H)  # the table's gradient, its own size


def test_schemes_the_kernel_cannot_express_are_refused():
    _, _, _, pos = _inputs()
    for name in ("shaw", "cope", "deberta"):  # a bias from the content, a value term, whole rows
        spec = CallSpec(name, T, K, "float32")
        assert "model.attention=pallas cannot express" in PATHS["pallas"].accepts(_scheme(name).traits, spec)
    with pytest.raises(ValueError, match="'shaw'.*model.attention=pallas cannot express"):
        choice.choose(ModelConfig(attention="pallas"), _scheme("shaw"), pos, jnp.float32, dropping=False)


def _one_update(attention: str, attention_dropout: float, *, batch: int = 4, mesh=None):
    """Parameters and loss after one training update of a tiny t5 model through the training step
    (2 micro-steps; with dropout, per-row keys, as training draws them). With a `mesh`, the step
    runs per device over it (`per_device_mesh`)."""
    from experiment import config as config_lib
    from experiment.runtime import sharding
    from experiment.train import init_state, optimizer, step as train_step
    from tests.conftest import tiny_config
    config = tiny_config("t5")
    config.model.update(dict(num_layers=1, attention=attention, attention_dropout=attention_dropout))
    config.train.update(dict(batch_size=batch, seq_len=24))
    config = config_lib.resolve(config)
    tx = optimizer.make_optimizer(config.train)
    graphdef, params, opt_state, shards, scheme = init_state(
        config, 64, tx, mesh or sharding.make_mesh(1, jax.devices()[:1]))
    step = train_step.make_train_step(graphdef, tx, 7, micro_steps=2, grad_shardings=shards,
                                      per_example_keys=train_step.is_stochastic(config.model, scheme),
                                      per_device_mesh=mesh)
    tokens = np.random.default_rng(0).integers(0, 64, (batch, 25))
    params, _, metrics = step(params, opt_state, tokens[:, :-1], tokens[:, 1:], np.int32(0))
    return params, float(metrics["loss"])


PER_DEVICE_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
import jax, numpy as np
from experiment.runtime import sharding
from tests.models.attention.test_pallas import _one_update
params, loss = _one_update("pallas", 0.3, batch=16, mesh=sharding.make_mesh(2))  # data 4 x fsdp 2
print(json.dumps({{"devices": jax.device_count(), "loss": loss,
                  "params": [np.asarray(x).tolist() for x in jax.tree.leaves(params)]}}))
"""


@pytest.mark.slow  # ~20 s: a subprocess with 8 simulated devices
def test_per_device_training_step_on_eight_devices_matches_one_device():
    """Several devices run the kernel per device (shard_map over the batch axes, as training does
    where the compiled kernel cannot be partitioned): with dropout, the update equals one device's."""
    from tests.conftest import REPO, run_entry
    result = run_entry("-c", PER_DEVICE_SCRIPT.format(repo=str(REPO)), timeout=600,
                       env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8
    params, loss = _one_update("pallas", 0.3, batch=16)
    assert out["loss"] == pytest.approx(loss, rel=1e-5)
    for got, want in zip(out["params"], jax.tree.leaves(params)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)


def test_training_step_with_pallas_attention_equals_dense():
    (dense, dense_loss), (kernel, kernel_loss) = (_one_update(kind, 0.0) for kind in ("dense", "pallas"))
    assert kernel_loss == pytest.approx(dense_loss, rel=1e-5)
    for want, got in zip(jax.tree.leaves(dense), jax.tree.leaves(kernel)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # with attention dropout: per-row keys (a vmap over rows of the kernel), other masks, similar loss
    _, dropped_loss = _one_update("pallas", 0.3)
    assert np.isfinite(dropped_loss) and dropped_loss != kernel_loss
    assert dropped_loss == pytest.approx(kernel_loss, rel=0.05)


@pytest.mark.parametrize("name", BIAS_SCHEMES + ["rope", "logn", "nope", "pope"])
def test_kernel_lowers_to_triton_for_a_gpu(name):
    """Pallas' Triton lowering runs without a GPU: the forward and backward kernels of every scheme
    (bfloat16, dropout, a vmap over rows as training's per-row keys make it) are lowered for CUDA at
    head sizes 64 and 128 and at L = 512 (training), 16,384 and 65,536 (evaluation). What it cannot
    check here is Triton's own compilation to PTX."""
    b, h = 2, 8
    for d in (64, 128):
        dims = posenc.ModelDims(d_model=h * d, num_heads=h, head_dim=d, num_layers=1, train_length=512)
        graphdef, state = nnx.split(posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0)))
        for t in (512, 16384, 65536):
            pos = jnp.arange(t, dtype=jnp.int32)[None]

            def row(state, q, k, v, key):
                return pallas_attention(q[None], k[None], v[None], pos, pos, nnx.merge(graphdef, state),
                                        Dropout(0.1, key), Launch(interpret=False))[0].astype(jnp.float32).sum()

            def loss(state, q, k, v, keys):
                return jax.vmap(row, in_axes=(None, 0, 0, 0, 0))(state, q, k, v, keys).sum()
            x = jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16)
            with lowering_for_a_gpu():
                lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(
                    state, x, x, x, jax.random.split(jax.random.key(0), b)).lower(lowering_platforms=("cuda",))
            assert lowered.as_text().count("xla.gpu.triton") == 3, (d, t)  # forward, dQ, dK / dV


def test_layers_of_one_shape_share_one_traced_kernel_call():
    """Issue 68, item 4: each layer carried its own kernel config (hashed by identity), so a model's
    layers lowered the kernel once each; equal configs are one jitted call now, lowered once."""
    from configs import demo
    from experiment.model import build_model
    from flax import nnx
    from models.attention import pallas as kernel

    def lowered(layers: int) -> int:
        c = demo.get_config("alibi")
        c.model.update(dict(num_layers=layers, d_model=32, num_heads=2, mlp_dim=64, attention="pallas",
                            attention_check=False))
        c.train.seq_len = 32
        graphdef, state = nnx.split(build_model(c, 64))
        x = jnp.zeros((1, 32), jnp.int32)
        return len(jax.jit(lambda s: nnx.merge(graphdef, s)(x).sum()).lower(state).as_text())
    kernel._flash_call.clear_cache()
    one, four = lowered(1), lowered(4)
    assert four < 1.6 * one, (one, four)  # the kernel's body once, whatever the number of layers
