"""Naive absolute encodings (integer, normalized, binary), multiplicative and hierarchical."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc


def build(name, d_model=16, train_length=5, **options):
    cfg = posenc.default_config(name)
    if options:
        cfg[name].update(options)
    dims = posenc.ModelDims(d_model=d_model, num_heads=2, head_dim=d_model // 2, num_layers=1,
                            train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def embed_zeros(scheme, positions, d_model=16):
    positions = jnp.asarray(positions)[None]
    return np.asarray(scheme.embed(jnp.zeros((1, positions.shape[1], d_model)), positions))[0]


def test_integer_adds_the_index_to_the_first_feature():
    out = embed_zeros(build("integer"), [0, 1, 7, 300])
    np.testing.assert_array_equal(out[:, 0], [0, 1, 7, 300])
    assert (out[:, 1:] == 0).all()


def test_normalized_denominators():
    out = embed_zeros(build("normalized"), [0, 1, 2, 3])  # train_length 5: p / 4
    np.testing.assert_allclose(out[:, 0], [0, 0.25, 0.5, 0.75])
    assert (out[:, 1:] == 0).all()
    row = build("normalized", denominator="row")
    np.testing.assert_allclose(embed_zeros(row, [0, 1, 2, 3])[:, 0], [0, 1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(embed_zeros(row, [0, 1, 2, 3, 4, 5, 6, 7, 8])[:3, 0], [0, 1 / 8, 2 / 8])
    assert embed_zeros(row, [0])[0, 0] == 0.0  # a single token: no division by zero
    with pytest.raises(ValueError, match="denominator"):
        build("normalized", denominator="max")


def test_normalized_denominators_agree_in_training_windows():
    x = jax.random.normal(jax.random.key(0), (1, 5, 16))
    positions = jnp.arange(5)[None]  # a training window: 0 .. L_train - 1
    by_train = build("normalized").embed(x, positions)
    by_row = build("normalized", denominator="row").embed(x, positions)
    np.testing.assert_array_equal(by_train, by_row)


def test_binary_digits():
    out = embed_zeros(build("binary", max_bits=4), [0, 5, 10, 15])
    np.testing.assert_array_equal(out[:, :4], [[-1, -1, -1, -1], [1, -1, 1, -1], [-1, 1, -1, 1], [1, 1, 1, 1]])
    assert (out[:, 4:] == 0).all()
    np.testing.assert_array_equal(posenc.binary_digits(jnp.array(6), 3), [-1, 1, 1])


def test_binary_length_limit():
    scheme = build("binary", max_bits=4)
    scheme.check_length(16)
    with pytest.raises(posenc.LengthError) as err:
        scheme.check_length(17)
    message = str(err.value)
    assert "binary" in message and "16" in message and "17" in message
    assert "--config.posenc.binary.max_bits=5" in message
    with pytest.raises(ValueError, match="max_bits"):
        build("binary", d_model=8, max_bits=9)


def test_multiplicative_sinusoidal_is_x_times_pe():
    scheme = build("multiplicative")
    x = jax.random.normal(jax.random.key(0), (1, 3, 16))
    positions = jnp.array([[0, 2, 9]])
    out = np.asarray(scheme.embed(x, positions))[0]
    for row, p in enumerate([0, 2, 9]):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            sin_feature, cos_feature = float(x[0, row, 2 * i]), float(x[0, row, 2 * i + 1])
            assert out[row, 2 * i] == pytest.approx(sin_feature * math.sin(angle), abs=1e-5)
            assert out[row, 2 * i + 1] == pytest.approx(cos_feature * math.cos(angle), abs=1e-5)
    shifted = np.asarray(build("multiplicative", offset=1.0).embed(x, positions))
    np.testing.assert_allclose(shifted, np.asarray(x) * (1 + np.asarray(posenc.sinusoidal_table(positions, 16))),
                               rtol=1e-6)


def test_multiplicative_learned_table():
    scheme = build("multiplicative", table="learned", train_length=6)
    np.testing.assert_allclose(scheme.pos_table[...], posenc.sinusoidal_table(jnp.arange(6), 16), atol=1e-7)
    scheme.pos_table[...] = jnp.arange(6 * 16, dtype=jnp.float32).reshape(6, 16)
    x = jnp.full((1, 2, 16), 2.0)
    rows = jnp.array([1, 5])
    np.testing.assert_array_equal(scheme.embed(x, rows[None])[0], 2.0 * scheme.pos_table[...][rows])
    scheme.check_length(6)
    with pytest.raises(posenc.LengthError) as err:
        scheme.check_length(7)
    assert "--config.posenc.multiplicative.max_length=7" in str(err.value)
    build("multiplicative").check_length(10 ** 6)  # the sinusoidal table has no limit
    with pytest.raises(ValueError, match="table"):
        build("multiplicative", table="rope")


def test_hierarchical_extends_the_learned_table():
    n, alpha = 4, 0.4
    scheme = build("hierarchical", train_length=n)
    table = np.asarray(jax.random.normal(jax.random.key(1), (n, 16)))
    scheme.table[...] = jnp.asarray(table)
    positions = jnp.arange(n * n)
    out = embed_zeros(scheme, positions)
    np.testing.assert_array_equal(out[:n], table)  # exactly the learned rows
    q = (table - alpha * table[0]) / (1 - alpha)  # Su's construction, 1-based in the post
    for p in range(n * n):
        i, j = divmod(p, n)
        np.testing.assert_allclose(out[p], alpha * q[i] + (1 - alpha) * q[j], rtol=1e-5, atol=1e-5)
    assert len({tuple(np.round(r, 5)) for r in out}) == n * n  # all n^2 positions distinct
    scheme.check_length(n * n)
    with pytest.raises(posenc.LengthError) as err:
        scheme.check_length(n * n + 1)
    message = str(err.value)
    assert "hierarchical" in message and "16" in message and "17" in message
    assert "--config.posenc.hierarchical.max_length=5" in message
    with pytest.raises(ValueError, match="alpha"):
        build("hierarchical", alpha=1.0)
