"""Sinusoidal (fairseq's and Vaswani's tables) and the learned table's length limit."""
import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc


def test_sinusoidal_default_is_fairseqs_table_from_position_2():
    """fairseq SinusoidalPositionalEmbedding.get_embedding, written out: h = d/2,
    emb[p, i] = sin(p * exp(-i log(10000)/(h-1))), emb[p, h+i] = cos(same); token t at p = t + 2."""
    d = 12
    h = d // 2
    dims = posenc.ModelDims(d_model=d, num_heads=2, head_dim=6, num_layers=1, train_length=8)
    scheme = posenc.build(posenc.default_config("sinusoidal"), dims, rngs=nnx.Rngs(0))
    assert scheme.options.layout == "fairseq"
    tokens = [0, 1, 5, 40]
    out = np.asarray(scheme.embed(jnp.zeros((1, 4, d)), jnp.asarray([tokens])))[0]
    for row, t in enumerate(tokens):
        p = t + 2
        for i in range(h):
            w = math.exp(-i * math.log(10000) / (h - 1))
            assert out[row, i] == pytest.approx(math.sin(p * w), abs=1e-5)
            assert out[row, h + i] == pytest.approx(math.cos(p * w), abs=1e-5)
    odd = np.asarray(posenc.fairseq_sinusoidal_table(jnp.arange(3), 7))
    assert odd.shape == (3, 7) and (odd[:, 6] == 0).all()
    vaswani = posenc.default_config("sinusoidal")
    vaswani.sinusoidal.layout = "vaswani"
    plain = posenc.build(vaswani, dims, rngs=nnx.Rngs(0)).embed(jnp.zeros((1, 4, d)), jnp.asarray([tokens]))
    np.testing.assert_array_equal(plain[0], posenc.sinusoidal_table(jnp.asarray(tokens), d))
    with pytest.raises(ValueError, match="layout=vaswani"):
        posenc.build(posenc.default_config("sinusoidal"),
                     posenc.ModelDims(d_model=2, num_heads=1, head_dim=2, num_layers=1, train_length=8),
                     rngs=nnx.Rngs(0))


def test_sinusoidal_matches_vaswani_formula():
    d, positions = 16, np.arange(50)
    table = np.asarray(posenc.sinusoidal_table(jnp.asarray(positions), d))
    for pos in positions:
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


def test_learned_table_refuses_longer_lengths_and_names_the_option():
    dims = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_length=32)
    scheme = posenc.build(posenc.default_config("learned"), dims, rngs=nnx.Rngs(0))
    scheme.check_length(32)
    with pytest.raises(posenc.LengthError) as err:
        scheme.check_length(64)
    message = str(err.value)
    assert "learned" in message and "32" in message and "64" in message
    assert "--config.posenc.learned.max_length=64" in message
