"""Naive absolute encodings: integer, normalized, binary."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc
from tests.posenc.helpers import build_embedding as build, embed_zeros


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
