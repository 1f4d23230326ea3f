"""Complex order embeddings: linearly transformable in position."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc
from tests.posenc.helpers import build_with as build, positions


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
