"""FoPE against a transcription of the authors' `FourierEmbedding` (TsinghuaC3I/Fourier-Position-Embedding,
olmo/model.py), written out here in numpy in the configuration of their published runs."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from posenc.fope import fourier_coefficients


def build(head_dim, heads=2, train_length=64, **options):
    cfg = posenc.default_config("fope")
    cfg.fope.update(options)
    dims = posenc.ModelDims(d_model=head_dim * heads, num_heads=heads, head_dim=head_dim, num_layers=1,
                            train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def reference_inv_freq(dim, max_sequence_length, rope_theta=10000.0, floor_freq_ratio=1.0):
    """`RotaryEmbedding.get_inv_freq` with rope_clamp_floor_freq and rope_clamp_floor_to_zero, then
    `fourier_ignore_zero`: frequencies below the floor set to 0, and the zeros dropped."""
    inv_freq = 1.0 / rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    floor_freq = 2 * np.pi / max_sequence_length * floor_freq_ratio
    inv_freq[inv_freq < floor_freq] = 0.0
    return inv_freq[inv_freq != 0.0]


def reference_step_eye(shape, input_dim, output_dim):
    param = np.zeros(shape, np.float32)
    step = math.ceil(input_dim / output_dim)
    for i in range(output_dim):
        if i * step < input_dim:
            param[..., i * step, i] = 1.0
    return param


def reference_fourier_embedding(t, positions, inv_freq, sin_coef, cos_coef):
    """`FourierEmbedding.apply_rotary_pos_emb` (separate bases per head, no norm, zeros ignored) on
    t (b, h, T, hs) with positions (T,): einsum of sin / cos over the frequencies, padded with ones
    to hs/2, duplicated, then t * cos + rotate_half(t) * sin."""
    head_dim = t.shape[-1]
    freqs = np.einsum("t, d -> td", positions, inv_freq)[None, None]  # (1, 1, T, D)
    fourier_sin = np.einsum("bhtD, hDd -> bhtd", np.sin(freqs), sin_coef)
    fourier_cos = np.einsum("bhtD, hDd -> bhtd", np.cos(freqs), cos_coef)
    pad = [(0, 0)] * 3 + [(0, head_dim // 2 - fourier_sin.shape[-1])]
    fourier_sin = np.concatenate([np.pad(fourier_sin, pad, constant_values=1)] * 2, axis=-1)
    fourier_cos = np.concatenate([np.pad(fourier_cos, pad, constant_values=1)] * 2, axis=-1)
    x1, x2 = np.split(t, 2, axis=-1)
    return t * fourier_cos + np.concatenate([-x2, x1], axis=-1) * fourier_sin


@pytest.mark.parametrize("head_dim, train_length", [(32, 64), (16, 1024)])
def test_fope_turns_q_and_k_as_the_authors_fourier_embedding(head_dim, train_length):
    """(32, 64): 5 frequencies kept, 5 series (identity); (16, 1024): 5 kept, 4 series (step
    identity: pair 3 has no dominant frequency) and 4 position-free pairs."""
    scheme = build(head_dim, train_length=train_length)
    inv_freq = reference_inv_freq(head_dim, train_length)
    np.testing.assert_allclose(scheme.frequencies, inv_freq, rtol=1e-7)
    input_dim, output_dim = len(inv_freq), min(len(inv_freq), head_dim // 4)
    sin_coef, cos_coef = scheme.coefficients()
    assert sin_coef.shape == cos_coef.shape == (2, input_dim, output_dim)
    q = jax.random.normal(jax.random.key(0), (1, 9, 2, head_dim))
    k = jax.random.normal(jax.random.key(1), (1, 9, 2, head_dim))
    pos = jnp.arange(9)[None] * 13 + 2
    for got, x in zip(scheme.rotate(q, k, pos, pos), (q, k)):
        t = np.moveaxis(np.asarray(x, np.float64), 2, 1)  # (b, h, T, hs), as the reference holds it
        want = reference_fourier_embedding(t, np.asarray(pos[0], np.float64), inv_freq, sin_coef, cos_coef)
        np.testing.assert_allclose(np.asarray(got), np.moveaxis(want, 1, 2), rtol=1e-5, atol=1e-5)


def test_fope_coefficients_are_the_step_identity_plus_a_xavier_normal_draw():
    heads, rows, cols = 64, 64, 16  # torch's xavier_normal_ on (H, M, C): fan_in M C, fan_out H C
    sin, cos = fourier_coefficients(heads, rows, cols, 0.3, 0)
    eye = reference_step_eye((heads, rows, cols), rows, cols)
    want_std = 0.3 * math.sqrt(2.0 / (rows * cols + heads * cols))
    for coef in (sin, cos):
        assert np.std(coef - eye) == pytest.approx(want_std, rel=0.03)
        assert abs(np.mean(coef - eye)) < 0.1 * want_std
    assert not np.allclose(sin, cos)
    np.testing.assert_array_equal(fourier_coefficients(2, 5, 4, 0.0, 0)[0], reference_step_eye((2, 5, 4), 5, 4))
    np.testing.assert_array_equal(build(32, seed=0).coefficients()[0], build(32, seed=0).coefficients()[0])
    assert not np.allclose(build(32, seed=0).coefficients()[0], build(32, seed=1).coefficients()[0])


def test_fope_has_no_state_to_train_and_refuses_meaningless_options():
    assert jax.tree.leaves(nnx.state(build(32))) == []  # coefficients are a constant of the options
    for options, match in ((dict(init_gain=-1.0), "init_gain"), (dict(floor_ratio=-0.5), "floor_ratio"),
                           (dict(base=1.0), "fope.base")):
        with pytest.raises(ValueError, match=match):
            build(32, **options)
