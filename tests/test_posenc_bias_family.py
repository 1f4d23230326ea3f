"""KERPLE (log, power), Sandwich and FIRE: each bias against its formula on hand-computed cases."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM, ModelConfig
from posenc.kerple import inverse_sigmoid, inverse_softplus
from posenc.sandwich import distance_function

POS = jnp.arange(8)[None]


def build(name, heads=2, train_length=16, **options):
    cfg = posenc.default_config(name)
    if options:
        cfg[name].update(options)
    dims = posenc.ModelDims(d_model=8 * heads, num_heads=heads, head_dim=8, num_layers=1,
                            train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def set_param(param, value):
    param[...] = jnp.asarray(value, jnp.float32)


def test_kerple_log_formula():
    scheme = build("kerple_log")
    set_param(scheme.r1_raw, inverse_softplus(jnp.array([2.0, 0.5])))
    set_param(scheme.r2_raw, inverse_softplus(jnp.array([0.5, 3.0])))
    bias = np.asarray(scheme.bias(None, None, POS, POS))[0]
    assert bias[0, 4, 1] == pytest.approx(-2.0 * math.log(2.5), rel=1e-5)  # |4 - 1| = 3
    assert bias[1, 7, 0] == pytest.approx(-0.5 * math.log(22.0), rel=1e-5)
    assert bias[0, 3, 3] == 0.0
    assert bias[0, 1, 4] == bias[0, 4, 1]  # |i - j|


def test_kerple_power_formula_and_range():
    scheme = build("kerple_power")
    set_param(scheme.r1_raw, inverse_softplus(jnp.array([0.5, 1.0])))
    set_param(scheme.r2_raw, inverse_sigmoid(jnp.array([1.5, 0.5]) / 2))
    bias = np.asarray(scheme.bias(None, None, POS, POS))[0]
    assert bias[0, 5, 1] == pytest.approx(-0.5 * 4 ** 1.5, rel=1e-5)  # = -4
    assert bias[1, 6, 2] == pytest.approx(-1.0 * 4 ** 0.5, rel=1e-5)
    assert bias[1, 2, 2] == 0.0
    r1, r2 = build("kerple_power", heads=16).coefficients()
    assert (r1 > 0).all() and (r2 > 0).all() and (r2 <= 2).all()


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power", "fire"])
def test_learned_bias_gradients_are_finite(name):
    scheme = build(name)
    params = nnx.state(scheme, nnx.Param)
    graphdef = nnx.graphdef(scheme)

    def loss(params):
        merged = nnx.merge(graphdef, params)
        return jnp.sum(merged.bias(None, None, POS, POS) ** 2)  # includes distance 0 and j > i

    grads = jax.grad(loss)(params)
    leaves = jax.tree.leaves(grads)
    assert leaves and all(np.isfinite(g).all() for g in leaves)
    assert any(np.abs(g).sum() > 0 for g in leaves)


def test_sandwich_formula():
    scheme = build("sandwich", heads=2, dim=4)
    pos = jnp.array([[0, 1, 3, 50, 400]])
    bias = np.asarray(scheme.bias(None, None, pos, pos))[0]
    compression = [8 * 1 / 2, 8 * 2 / 2]  # 8h/H
    p = [0, 1, 3, 50, 400]
    for h in range(2):
        for a in range(5):
            for b in range(5):
                d = p[a] - p[b]
                inner = math.cos(d / 10000 ** (2 / 4)) + math.cos(d / 10000 ** (4 / 4))  # k = 1, 2
                assert bias[h, a, b] == pytest.approx((inner - 2) / compression[h], abs=1e-6)
    np.testing.assert_allclose(posenc.sandwich_compression(8), [1, 2, 3, 4, 5, 6, 7, 8])
    # dim = 0: d' = the head dimension (8 here), k = 1 .. 4
    head_dim = np.asarray(build("sandwich", heads=2, dim=0).bias(None, None, pos, pos))[0]
    inner = sum(math.cos(50 / 10000 ** (2 * k / 8)) for k in range(1, 5))
    assert head_dim[1, 3, 0] == pytest.approx((inner - 4) / compression[1], abs=1e-6)


def test_sandwich_default_decays_with_distance():
    distance = jnp.arange(4096)[None]
    bias = np.asarray(build("sandwich", heads=4).bias(None, None, distance, jnp.zeros((1, 1), int)))[0, :, :, 0]
    assert bias[:, 0].tolist() == [0.0] * 4 and (bias[:, 1:] < 0).all()
    bands = [bias[:, a:b].mean(axis=-1) for a, b in [(1, 16), (16, 64), (64, 256), (256, 1024), (1024, 4096)]]
    assert (np.diff(bands, axis=0) < 0).all()  # decays (with ripples) over distance
    np.testing.assert_allclose(bias[0], 4 * bias[3], rtol=1e-6, atol=1e-5)  # 8h/H: 2 vs 8


def test_distance_table_equals_pairwise():
    fn = lambda d: posenc.sinusoid_inner_product(d, 128)
    consecutive = jnp.stack([jnp.arange(6) + 100, jnp.arange(6)])
    scattered = jnp.array([[0, 5, 9, 10, 30, 31], [3, 3, 4, 8, 8, 9]])
    for q_pos, k_pos in [(consecutive, consecutive), (consecutive, scattered), (scattered, consecutive)]:
        got = distance_function(fn, q_pos, k_pos)
        np.testing.assert_array_equal(got, fn(q_pos[:, :, None] - k_pos[:, None, :]))


def test_fire_formula():
    """The reference FIRE module, written out: psi(x) = log(|c x| + 1), L = |m L_0|,
    bias = MLP(psi(i - j) / (psi(max(i, L)) + 1e-6))."""
    scheme = build("fire", heads=2, hidden=1, threshold_init=4.0)
    set_param(scheme.c, 0.5)
    set_param(scheme.threshold_multiplier, -1.5)  # L = |-1.5 * 4| = 6
    set_param(scheme.w1, [1.0])
    set_param(scheme.b1, [0.0])
    set_param(scheme.w2, [[1.0, -2.0]])
    set_param(scheme.b2, [0.0, 0.5])
    bias = np.asarray(scheme.bias(None, None, POS, POS))[0]
    psi = lambda x: math.log(abs(0.5 * x) + 1)
    for i, j in [(2, 0), (3, 3), (7, 3), (7, 0), (5, 4), (6, 1)]:
        x = psi(i - j) / (psi(max(6, i)) + 1e-6)
        assert bias[0, i, j] == pytest.approx(x, rel=1e-5, abs=1e-7)
        assert bias[1, i, j] == pytest.approx(-2 * x + 0.5, rel=1e-5)
    far = scheme.normalized_distance(jnp.array([[1000]]), jnp.array([[0]]))[0, 0, 0]
    assert far == pytest.approx(math.log(501) / (math.log(501) + 1e-6), rel=1e-6)


def test_fire_default_initialisation_is_the_references():
    scheme = build("fire", train_length=64)
    assert float(scheme.c[...]) == pytest.approx(0.1)
    assert float(scheme.threshold_multiplier[...]) == 1.0 and float(scheme.threshold()) == 512.0
    assert float(build("fire", train_length=64, threshold_init=0.0).threshold()) == 64.0
    assert scheme.w1.shape == (32,) and scheme.w2.shape == (32, 2)
    # nn.Linear's default: uniform in +-1/sqrt(fan_in), biases included (fan_in 1, then 32)
    for param, bound in [(scheme.w1, 1.0), (scheme.b1, 1.0), (scheme.w2, 32 ** -0.5), (scheme.b2, 32 ** -0.5)]:
        values = np.asarray(param[...])
        assert np.abs(values).max() <= bound and np.abs(values).max() > 0.3 * bound


def test_per_layer_parameters_and_no_length_limit():
    cfg = ModelConfig(vocab_size=11, num_layers=2, d_model=16, num_heads=2, mlp_dim=32)
    far = jnp.array([[0, 5, 1000, 100_000]])
    for name, shared in (("kerple_log", True), ("kerple_power", True), ("fire", False)):
        model = DecoderLM(cfg, posenc.default_config(name), train_length=8, rngs=nnx.Rngs(0))
        # KERPLE: one (r1, r2) for the stack, as the authors' code; per layer on request
        assert (model.blocks[0].attn.scheme is model.blocks[1].attn.scheme) == shared
        if shared:
            per_layer = posenc.default_config(name)
            per_layer[name].per_layer = True
            split = DecoderLM(cfg, per_layer, train_length=8, rngs=nnx.Rngs(0))
            assert split.blocks[0].attn.scheme is not split.blocks[1].attn.scheme
        model.scheme.check_length(10 ** 6)
        assert np.isfinite(model.blocks[0].attn.scheme.bias(None, None, far, far)).all()
