"""DAPE against a transcription of the authors' AliBi_C / ParallelKerpleLog_C forward pass, and what
it refines (any base, one MLP per layer)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.attention import tile_logits
from models.config import ModelConfig
from tests.posenc.helpers import build_with as build, positions

DIMS = posenc.ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=1, train_length=16)


def _reference_dape(scores, base, w1, b1, w2, b2):
    """chuanyang-Zheng/DAPE, positional_embeddings.py, written out: x_a_bias = cat((x, a), dim=1)
    (heads), permuted to the last axis, mlp2 = Linear(2H, W), LeakyReLU(0.01), Linear(W, H),
    permuted back; return x + a + x_a_bias."""
    base = np.tile(base, (scores.shape[0], 1, 1, 1))
    u = np.concatenate([scores, base], axis=1).transpose(0, 2, 3, 1)  # b, i, j, 2H
    hidden = u @ w1 + b1
    hidden = np.where(hidden > 0, hidden, 0.01 * hidden)
    return scores + base + (hidden @ w2 + b2).transpose(0, 3, 1, 2)


def _reference_base(name, scheme, t):
    """The reference's base biases on the causal triangle: AliBi -slope (i - j); KERPLE's log kernel
    -p log(1 + a (i - j)) with (p, a) this scheme's (r1, r2)."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    distance = np.tril(i - j).astype(np.float64)
    if name == "alibi":
        return -np.asarray(posenc.alibi_slopes(4))[:, None, None] * distance
    r1, r2 = (np.asarray(c, np.float64) for c in scheme.inner.coefficients())
    return -r1[:, None, None] * np.log1p(r2[:, None, None] * distance)


@pytest.mark.parametrize("base", ["alibi", "kerple_log"])
def test_dape_logits_are_the_references(base):
    scheme = build("dape", DIMS, dape__base=base)
    t = 10
    q = jax.random.normal(jax.random.key(0), (2, t, 4, 8))
    k = jax.random.normal(jax.random.key(1), (2, t, 4, 8))
    pos = positions(2, t)
    got = np.asarray(tile_logits(q, k, pos, pos, scheme))
    scores = np.einsum("bthk,bshk->bhts", np.asarray(q, np.float64), np.asarray(k, np.float64)) / math.sqrt(8)
    params = (np.asarray(p[...], np.float64) for p in (scheme.w1, scheme.b1, scheme.w2, scheme.b2))
    expected = _reference_dape(scores, _reference_base(base, scheme, t)[None], *params)
    causal = np.tril(np.ones((t, t), bool))  # above the diagonal the two bases differ; it is masked
    np.testing.assert_allclose(got[..., causal], expected[..., causal], rtol=1e-4, atol=1e-4)
    assert not np.allclose(got[..., causal], (scores + _reference_base(base, scheme, t)[None])[..., causal],
                           atol=1e-2)  # the refinement is there


def test_dape_has_one_mlp_and_one_base_per_layer_with_pytorch_init():
    model = DecoderLM(ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64),
                      posenc.default_config("dape"), train_length=16, rngs=nnx.Rngs(0))
    first, second = (block.attn.scheme for block in model.blocks)
    assert first is not second and first.inner is not second.inner  # per layer, whatever the base
    assert first.inner.name == "kerple_log" and first.w1.shape == (8, 32) and first.w2.shape == (32, 4)
    assert float(jnp.abs(first.w1[...]).max()) <= 8 ** -0.5 and float(jnp.abs(first.w2[...]).max()) <= 32 ** -0.5
    assert first.bias_fn() is None  # no kernel may add the base bias alone
    with pytest.raises(ValueError, match="dape cannot wrap 'stickbreaking'"):
        build("dape", DIMS, dape__base="stickbreaking")
