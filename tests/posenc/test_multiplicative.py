"""Multiplicative position encoding: x * PE, sinusoidal or learned table."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc
from tests.posenc.helpers import build_embedding as build


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
