"""Causal convolution as a position encoding: position only through the zero padding."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc.conv import causal_conv
from tests.posenc.helpers import build_with as build, positions


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
