"""FLOATER (`floater`, once `recurrent`): positions from a learned ODE, integrated with RK4."""
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import posenc
from posenc.floater import rk4_positions
from tests.posenc.helpers import DIMS, build_with as build, positions


def sinusoidal_dynamics(d_model: int, base: float = 10000.0) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The linear h(p) = A p whose flow from p(0) = [sin 0, cos 0, ...] is `sinusoidal_table`:
    A block-diagonal with blocks [[0, w_i], [-w_i, 0]] on each (sin, cos) pair, w_i = base^(-2i/d),
    since d/dt sin(w t) = w cos(w t) and d/dt cos(w t) = -w sin(w t)."""
    i = jnp.arange((d_model + 1) // 2, dtype=jnp.float32)
    inv_freq = base ** (-2.0 * i / d_model)

    def h(p_D, t):
        pairs = jnp.pad(p_D, (0, (-d_model) % 2)).reshape(-1, 2)
        dp = jnp.stack([inv_freq * pairs[:, 1], -inv_freq * pairs[:, 0]], axis=-1)
        return dp.reshape(-1)[:d_model]
    return h


def test_floater_with_rotation_dynamics_reproduces_the_sinusoidal_encoding():
    d, n = 16, 64
    p0 = posenc.sinusoidal_table(jnp.zeros((), jnp.int32), d)
    table = rk4_positions(sinusoidal_dynamics(d), p0, n, steps_per_unit=16)
    np.testing.assert_allclose(table, posenc.sinusoidal_table(jnp.arange(n), d), atol=1e-4)


def test_floater_extends_to_any_length_and_gathers_explicit_positions():
    scheme = build("floater")
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
    wide = build("floater", floater__extra_positions=40)
    traced = jax.jit(lambda p: wide.embed(x[:, :5], p))(positions(2, 5, start=35))
    np.testing.assert_allclose(traced, pe[:, 35:], atol=1e-5)
