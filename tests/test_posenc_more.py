"""Defining properties of conv, complex_order, recurrent (FLOATER), cope and the logn / randomized wrappers."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM, ModelConfig
from models.attention import blockwise_attention, needs_whole_rows
from posenc.conv import causal_conv
from posenc.cope import contextual_positions
from posenc.recurrent import rk4_positions, sinusoidal_dynamics

DIMS = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_length=16)
CFG = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64)


def build(name, dims=DIMS, **options):
    cfg = posenc.default_config(name)
    for key, value in options.items():
        block, field = key.split("__")
        cfg[block][field] = value
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def positions(b, t, start=0):
    return jnp.broadcast_to(jnp.arange(start, start + t, dtype=jnp.int32), (b, t))


@pytest.mark.parametrize("name", ["conv", "complex_order", "recurrent", "cope", "logn", "randomized"])
def test_scheme_has_docstring_family_and_citation(name):
    cls = posenc.get(name)
    assert cls.__doc__ and cls.family and cls.citation


# --- conv -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("depthwise", [True, False])
def test_conv_is_a_zero_padded_causal_convolution(depthwise):
    scheme = build("conv", conv__depthwise=depthwise, conv__kernel_size=3)
    x = np.asarray(jax.random.normal(jax.random.key(0), (2, 9, 16)))
    kernel = np.asarray(scheme.kernel[...])
    padded = np.concatenate([np.zeros((2, 2, 16)), x], axis=1)
    expected = x.copy()
    for t in range(9):
        for k in range(3):
            tap = padded[:, t + 2 - k]
            expected[:, t] += tap * kernel[k] if depthwise else tap @ kernel[k]
    got = scheme.embed(jnp.asarray(x, jnp.float32), positions(2, 9))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_conv_position_leaks_only_through_the_zero_padding():
    scheme = build("conv", conv__kernel_size=3)
    x = jax.random.normal(jax.random.key(1), (1, 4, 16))
    filler = jax.random.normal(jax.random.key(2), (1, 6, 16))
    early = scheme.embed(x, positions(1, 4))
    late = scheme.embed(jnp.concatenate([filler, x], axis=1), positions(1, 10))[:, 6:]
    # Tokens whose window lies inside the sequence (t >= K-1) do not know where they are ...
    np.testing.assert_allclose(late[:, 2:], early[:, 2:], atol=1e-6)
    # ... the first K-1 do (their window reaches into the padding); and the positions are unused.
    assert not np.allclose(late[:, :2], early[:, :2], atol=1e-3)
    np.testing.assert_array_equal(scheme.embed(x, positions(1, 4, start=100)), early)
    np.testing.assert_allclose(causal_conv(x, jnp.ones((1, 16))), x)


# --- complex_order -------------------------------------------------------------------------------
def test_complex_order_is_linearly_transformable_in_position():
    """f(x, pos + 1) = f(x, pos) rotated by w(x) in every (real, imaginary) pair."""
    scheme = build("complex_order")
    x = jax.random.normal(jax.random.key(0), (1, 5, 16))
    r, w, theta = scheme.amplitude_frequency_phase(x)
    for pos in (0, 7, 1000):
        f0 = np.asarray(scheme.embed(x, positions(1, 5, pos) * 0 + pos), np.float64)
        f1 = np.asarray(scheme.embed(x, positions(1, 5, pos) * 0 + pos + 1), np.float64)
        re, im = f0[..., :8], f0[..., 8:]
        cos, sin = np.cos(np.asarray(w, np.float64)), np.sin(np.asarray(w, np.float64))
        np.testing.assert_allclose(f1[..., :8], re * cos - im * sin, atol=2e-3 if pos == 1000 else 1e-5)
        np.testing.assert_allclose(f1[..., 8:], re * sin + im * cos, atol=2e-3 if pos == 1000 else 1e-5)
    # The amplitude is the modulus, whatever the position.
    f = scheme.embed(x, positions(1, 5, 3))
    np.testing.assert_allclose(jnp.hypot(f[..., :8], f[..., 8:]), jnp.abs(r), atol=1e-5)


def test_complex_order_refuses_an_odd_width():
    dims = posenc.ModelDims(d_model=15, num_heads=3, head_dim=5, num_layers=1, train_length=8)
    with pytest.raises(ValueError, match="even"):
        build("complex_order", dims)


# --- recurrent (FLOATER) -------------------------------------------------------------------------
def test_floater_with_rotation_dynamics_reproduces_the_sinusoidal_encoding():
    d, n = 16, 64
    p0 = posenc.sinusoidal_table(jnp.zeros((), jnp.int32), d)
    table = rk4_positions(sinusoidal_dynamics(d), p0, n, steps_per_unit=16)
    np.testing.assert_allclose(table, posenc.sinusoidal_table(jnp.arange(n), d), atol=1e-4)


def test_floater_extends_to_any_length_and_gathers_explicit_positions():
    scheme = build("recurrent")
    scheme.check_length(100 * DIMS.train_length)  # no table, no limit
    x = jnp.zeros((2, 40, 16))
    pe = scheme.embed(x, positions(2, 40))
    assert np.isfinite(pe).all() and not np.allclose(pe[:, 0], pe[:, 39])
    np.testing.assert_allclose(pe[:, 0], np.broadcast_to(scheme.p0[...], (2, 16)))
    # Concrete positions beyond T-1 are integrated as far as needed; a prefix is unchanged.
    shifted = scheme.embed(x[:, :5], positions(2, 5, start=35))
    np.testing.assert_allclose(shifted, pe[:, 35:], atol=1e-5)
    # Under jit the range is static: 0 .. T-1+extra_positions; beyond it NaN, loudly.
    traced = jax.jit(lambda p: scheme.embed(x[:, :5], p))(positions(2, 5, start=35))
    assert np.isnan(traced).all()
    wide = build("recurrent", recurrent__extra_positions=40)
    traced = jax.jit(lambda p: wide.embed(x[:, :5], p))(positions(2, 5, start=35))
    np.testing.assert_allclose(traced, pe[:, 35:], atol=1e-5)


# --- cope -----------------------------------------------------------------------------------------
def _naive_cope_bias(q, k, table):
    """The paper's formulas, one (query, key) pair at a time."""
    b, t, h, d = q.shape
    out = np.zeros((b, h, t, t))
    rows = table.shape[0]
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                gates = [1 / (1 + math.exp(-q[bi, i, hi] @ k[bi, s, hi] / math.sqrt(d))) for s in range(i + 1)]
                for j in range(i + 1):
                    p = min(sum(gates[j:i + 1]), rows - 1)
                    lo, hi_ = math.floor(p), min(math.ceil(p), rows - 1)
                    e = (1 - (p - lo)) * table[lo] + (p - lo) * table[hi_]
                    out[bi, hi, i, j] = q[bi, i, hi] @ e
    return out


@pytest.mark.parametrize("rows", [0, 4])
def test_cope_bias_is_q_dot_interpolated_embedding_of_the_gated_count(rows):
    scheme = build("cope", cope__max_positions=rows)
    q = np.asarray(jax.random.normal(jax.random.key(0), (2, 7, 2, 8)), np.float64)
    k = np.asarray(jax.random.normal(jax.random.key(1), (2, 7, 2, 8)), np.float64)
    pos = positions(2, 7)
    got = np.asarray(scheme.bias(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), pos, pos))
    expected = _naive_cope_bias(q, k, np.asarray(scheme.table[...], np.float64))
    causal = np.tril(np.ones((7, 7), bool))
    np.testing.assert_allclose(got[..., causal], expected[..., causal], atol=1e-5)


def test_cope_positions_count_gates_and_integer_counts_hit_table_rows():
    gates = jnp.asarray([[[[1.0, 1.0, 0.0, 1.0]]]])
    np.testing.assert_allclose(contextual_positions(gates)[0, 0, 0], [3, 2, 1, 1])
    scheme = build("cope")
    z = jnp.arange(12.0).reshape(1, 1, 1, 12)
    from posenc.cope import interpolate_logits
    np.testing.assert_allclose(interpolate_logits(z, jnp.asarray([[[[0.0, 2.0, 2.25, 11.0]]]])),
                               [[[[0.0, 2.0, 2.25, 11.0]]]])
    assert scheme.needs_full_rows and posenc.get("cope").per_layer


@pytest.mark.parametrize("wrapper", [None, "logn", "randomized"])
def test_cope_runs_blockwise_by_carrying_gate_sums_also_inside_a_wrapper(wrapper):
    """auto at 40 > 2 tiles of 8 goes blockwise (cope's carried_bias, passed through by wrappers)."""
    cfg = posenc.default_config(wrapper or "cope")
    if wrapper:
        cfg[wrapper].base = "cope"
    x = jax.random.randint(jax.random.key(0), (1, 40), 0, CFG.vocab_size)
    auto = DecoderLM(ModelConfig(**{**CFG.__dict__, "attention_block": 8}), cfg, train_length=16, rngs=nnx.Rngs(0))
    dense = DecoderLM(ModelConfig(**{**CFG.__dict__, "attention": "dense"}), cfg, train_length=16,
                      rngs=nnx.Rngs(0))
    assert not needs_whole_rows(auto.scheme)
    np.testing.assert_allclose(auto(x), dense(x), atol=1e-5)


def test_blockwise_refuses_a_whole_row_bias_it_cannot_carry():
    class WholeRows(posenc.Scheme):
        name = "whole_rows"
        needs_full_rows = True  # and no carried_bias

    scheme = WholeRows(None, DIMS, rngs=nnx.Rngs(0))
    assert needs_whole_rows(scheme)
    q = jnp.zeros((1, 12, 2, 8))
    with pytest.raises(ValueError, match="attention=dense"):
        blockwise_attention(q, q, q, positions(1, 12), positions(1, 12), scheme, block_size=4)


# --- logn -----------------------------------------------------------------------------------------
def test_logn_scales_the_query_by_one_within_training_length_and_log_ratio_beyond():
    scheme = build("logn", logn__base="alibi")
    pos = positions(1, 64)
    q = jax.random.normal(jax.random.key(0), (1, 64, 2, 8))
    k = jax.random.normal(jax.random.key(1), (1, 64, 2, 8))
    q_scaled, k_same = scheme.rotate(q, k, pos, pos)
    n = np.arange(1, 65)
    expected = np.where(n <= 16, 1.0, np.log(n) / np.log(16))
    np.testing.assert_allclose(np.asarray(q_scaled), np.asarray(q) * expected[None, :, None, None], rtol=1e-6)
    np.testing.assert_array_equal(k_same, k)
    assert scheme.logit_scale(pos, pos) is None  # alibi has none of its own


def logn_factor(m: int, train_length: int = 16) -> float:
    return max(1.0, math.log(m + 1) / math.log(train_length))


def test_logn_with_alibi_scales_q_dot_k_and_not_the_bias():
    """The whole logit beyond L_train, written out: s(m) q.k / sqrt(K) - slope_h (m - n)."""
    from models.attention import tile_logits
    scheme, t = build("logn", logn__base="alibi"), 40
    pos = positions(1, t)
    q = jax.random.normal(jax.random.key(2), (1, t, 2, 8))
    k = jax.random.normal(jax.random.key(3), (1, t, 2, 8))
    got = np.asarray(tile_logits(*scheme.rotate(q, k, pos, pos), pos, pos, scheme))[0]
    slopes = np.asarray(posenc.alibi_slopes(2))
    qn, kn = np.asarray(q)[0], np.asarray(k)[0]
    for m in (5, 20, 39):
        for n in (0, m // 2, m):
            for h in range(2):
                expected = logn_factor(m) * qn[m, h] @ kn[n, h] / math.sqrt(8) - slopes[h] * (m - n)
                assert got[h, m, n] == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_logn_with_rerope_scales_the_rectified_score():
    """As bojone/rerope: beyond L_train the logit is s(m) <R(min(m - n, w) theta) q_m, k_n> / sqrt(K)."""
    from models.attention import tile_logits
    w, t, d = 4, 40, 8
    scheme = build("logn", rope__rerope_window=w)
    pos = positions(1, t)
    q = jax.random.normal(jax.random.key(4), (1, t, 2, d))
    k = jax.random.normal(jax.random.key(5), (1, t, 2, d))
    got = np.asarray(tile_logits(*scheme.rotate(q, k, pos, pos), pos, pos, scheme))[0]
    theta = np.array([10000.0 ** (-2 * i / d) for i in range(d // 2)])
    qn, kn = np.asarray(q, np.float64)[0], np.asarray(k, np.float64)[0]

    def rotated(x, angle_positions):  # "rotate half" pairs (i, i + d/2)
        a = angle_positions * theta
        x1, x2 = x[: d // 2], x[d // 2:]
        return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)])
    for m in (10, 25, 39):
        for n in (0, m - 2, m - w - 1, m):
            for h in range(2):
                expected = logn_factor(m) * rotated(qn[m, h], min(m - n, w)) @ kn[n, h] / math.sqrt(d)
                assert got[h, m, n] == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_logn_delegates_to_its_inner_scheme():
    wrapped, alibi = build("logn", logn__base="alibi"), build("alibi")
    pos = positions(2, 20)
    np.testing.assert_array_equal(wrapped.bias(None, None, pos, pos), alibi.bias(None, None, pos, pos))
    # Options of the base reach the inner scheme; within L_train logn(rope) is rope exactly.
    within = positions(2, 16)
    yarn = build("logn", rope__yarn_scale=4.0)
    assert yarn.inner.options.yarn_scale == 4.0
    q = jax.random.normal(jax.random.key(0), (2, 16, 2, 8))
    for a, b in zip(yarn.rotate(q, q, within, within),
                    build("rope", rope__yarn_scale=4.0).rotate(q, q, within, within)):
        np.testing.assert_array_equal(a, b)
    deberta = build("logn", logn__base="deberta")  # the inner scheme's own logit scale passes through
    np.testing.assert_array_equal(deberta.logit_scale(pos, pos), build("deberta").logit_scale(pos, pos))


def test_wrappers_take_on_what_their_inner_scheme_needs():
    wrapped = build("logn", logn__base="cope")
    assert wrapped.per_layer and wrapped.needs_full_rows and wrapped.carries_bias
    assert not build("logn").needs_full_rows and not build("logn").carries_bias
    with pytest.raises(ValueError, match="wraps itself"):
        build("logn", logn__base="logn")
    with pytest.raises(ValueError, match="unknown positional scheme"):
        build("randomized", randomized__base="ropee")


# --- randomized -----------------------------------------------------------------------------------
def test_randomized_training_positions_are_sorted_random_subsets():
    scheme = build("randomized", randomized__max_length=40)
    pos = positions(4, 12)
    a = np.asarray(scheme.sample_positions(pos, jax.random.key(0)))
    b = np.asarray(scheme.sample_positions(pos, jax.random.key(1)))
    for sample in (a, b):
        assert sample.shape == (4, 12)
        assert (np.diff(sample, axis=-1) > 0).all()
        assert sample.min() >= 0 and sample.max() < 40
    assert not np.array_equal(a, b) and not np.array_equal(a[0], a[1])
    assert build("randomized").max_length == 16 * DIMS.train_length
    with pytest.raises(posenc.LengthError, match="randomized.max_length=41"):
        scheme.sample_positions(positions(1, 41), jax.random.key(0))


def test_randomized_evaluation_samples_positions_like_training():
    scheme = build("randomized", randomized__max_length=40)
    pos = positions(1, 12)
    sampled = np.asarray(scheme.sample_positions(pos, jax.random.key(3), training=False))
    assert (np.diff(sampled) > 0).all() and sampled.max() < 40 and not np.array_equal(sampled, pos)
    np.testing.assert_array_equal(sampled, scheme.sample_positions(pos, jax.random.key(3), training=False))
    consecutive = build("randomized", randomized__max_length=40, randomized__eval_positions="consecutive")
    np.testing.assert_array_equal(consecutive.sample_positions(pos, jax.random.key(3), training=False), pos)
    assert not np.array_equal(consecutive.sample_positions(pos, jax.random.key(3)), pos)  # training samples


def test_randomized_check_length_asks_the_inner_scheme_for_the_whole_range():
    with pytest.raises(posenc.LengthError, match="randomized.eval_positions=consecutive"):
        build("randomized").check_length(10_000)  # sampled evaluation positions: at most max_length
    build("randomized", randomized__eval_positions="consecutive").check_length(10_000)  # rope: any length
    scheme = build("randomized", randomized__base="learned", randomized__max_length=64)
    with pytest.raises(posenc.LengthError, match="learned.max_length=64"):
        scheme.check_length(16)
    build("randomized", randomized__base="learned", randomized__max_length=64,
          learned__max_length=64).check_length(16)


def test_randomized_model_evaluates_on_plain_positions_and_trains_causally():
    model = DecoderLM(CFG, posenc.default_config("randomized"), train_length=16, rngs=nnx.Rngs(0))
    plain = DecoderLM(CFG, posenc.default_config("rope"), train_length=16, rngs=nnx.Rngs(0))
    x = jax.random.randint(jax.random.key(0), (2, 12), 0, CFG.vocab_size)
    np.testing.assert_allclose(model(x), model(x, positions(2, 12)), atol=1e-6)
    key = jax.random.key(5)
    trained = model(x, dropout_key=key)
    assert not np.allclose(trained, model(x), atol=1e-4)  # training positions differ from 0..T-1
    assert not np.allclose(trained, model(x, dropout_key=jax.random.key(6)), atol=1e-4)
    assert np.allclose(plain(x, dropout_key=key), plain(x), atol=1e-6)  # others: no sampling
    changed = x.at[:, 8:].set((x[:, 8:] + 7) % CFG.vocab_size)
    np.testing.assert_allclose(model(changed, dropout_key=key)[:, :8], trained[:, :8], atol=1e-5)
