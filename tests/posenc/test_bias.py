"""ALiBi (the published slopes) and T5 (the published bucket table)."""
import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc


def _official_slopes(n):
    """The recipe of the ALiBi paper's code, written from its description (reference/README.md):
    a geometric sequence starting at 2^(-8/n) with that ratio; non-powers of two take the closest
    lower power's list plus every other slope of the doubled list."""
    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + _official_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", range(1, 33))
def test_alibi_slopes_are_the_official_ones(heads):
    np.testing.assert_allclose(posenc.alibi_slopes(heads), _official_slopes(heads), rtol=1e-12)


def test_alibi_slopes_published_examples():
    np.testing.assert_allclose(posenc.alibi_slopes(8), [2.0 ** -k for k in range(1, 9)])
    np.testing.assert_allclose(posenc.alibi_slopes(16)[:2], [2 ** -0.5, 2 ** -1.0])


def test_alibi_bias_is_minus_slope_times_distance():
    dims = posenc.ModelDims(d_model=16, num_heads=4, head_dim=4, num_layers=1, train_length=8)
    scheme = posenc.build(posenc.default_config("alibi"), dims, rngs=nnx.Rngs(0))
    pos = jnp.arange(6)[None]
    bias = np.asarray(scheme.bias(None, None, pos, pos))[0]
    slopes = posenc.alibi_slopes(4)
    for h in range(4):
        for i in range(6):
            for j in range(i + 1):
                assert bias[h, i, j] == pytest.approx(-slopes[h] * (i - j))


def test_t5_bucket_table():
    expected = [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11,
                11, 11, 11, 11]
    distance = np.arange(31)  # i - j: the key is `distance` positions before the query
    got = posenc.t5_relative_position_bucket(-distance, bidirectional=True, num_buckets=32, max_distance=128)
    assert np.asarray(got).tolist() == expected
    future = posenc.t5_relative_position_bucket(distance[1:], bidirectional=True)
    assert (np.asarray(future) >= 16).all()  # keys after the query use the other half
    assert int(posenc.t5_relative_position_bucket(-1000, bidirectional=True)) == 15
    assert int(posenc.t5_relative_position_bucket(-1000, bidirectional=False)) == 31
