"""FIRE against the reference module on hand-computed cases, and its initialisation."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

from tests.posenc.helpers import POS, build_bias as build, set_param


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
