"""Sandwich against its formula on hand-computed cases."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

import posenc
from posenc.sandwich import distance_function
from tests.posenc.helpers import build_bias as build


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
