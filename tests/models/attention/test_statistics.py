"""Attention statistics (models/attention/statistics.py): the tiled statistics equal a dense
computation, and the two extreme cases (all on the diagonal, uniform) give their closed forms."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.attention.dense import NEG_INF, tile_logits
from models.attention.statistics import attention_statistics, layer_statistics, qk_statistics
from models.config import ModelConfig

CFG = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64)
T, BLOCK = 40, 8


def make_model(name):
    return DecoderLM(CFG, posenc.default_config(name), train_length=16, rngs=nnx.Rngs(0))


def tokens(seed=0, b=2):
    return jax.random.randint(jax.random.key(seed), (b, T), 0, CFG.vocab_size)


def dense_qk(q, k, pos, scheme):
    """Mean distance and entropy (B x H x T) from the full T x T softmax."""
    q, k = scheme.rotate(q, k, pos, pos)
    t = q.shape[1]
    mask = jnp.tril(jnp.ones((t, t), bool))
    p = jax.nn.softmax(jnp.where(mask, tile_logits(q, k, pos, pos, scheme), NEG_INF), axis=-1)
    i = jnp.arange(t)
    dist = (p * (i[:, None] - i[None, :])).sum(-1)
    return dist, jax.scipy.special.entr(p).sum(-1)


@nnx.jit
def dense_model(model, toks):
    """Per layer (batch mean, H x T) with the decoder's forward written out."""
    b, t = toks.shape
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    x = model.scheme.embed(model.embed(toks) * CFG.d_model ** 0.5, pos)
    out = []
    for blk in model.blocks:
        qkv = blk.attn.qkv(blk.ln1(x)).reshape(b, t, 3, CFG.num_heads, -1)
        dist, ent = dense_qk(qkv[:, :, 0], qkv[:, :, 1], pos, blk.attn.scheme)
        out.append((dist.mean(0), ent.mean(0)))
        x = blk(x, pos)
    return jnp.stack([d for d, _ in out]), jnp.stack([e for _, e in out])


@pytest.mark.parametrize("name", ["alibi", "rope", "cope", pytest.param("t5", marks=pytest.mark.slow),
                                  pytest.param("kerple_log", marks=pytest.mark.slow)])
def test_tiled_statistics_equal_the_dense_softmax(name):
    model = make_model(name)
    toks = tokens()
    stats = attention_statistics(model, toks, block=BLOCK)
    dist, ent = dense_model(model, toks)
    assert stats["mean_distance"].shape == (CFG.num_layers, CFG.num_heads, T)
    np.testing.assert_allclose(stats["mean_distance"], dist, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(stats["entropy"], ent, atol=1e-4, rtol=1e-5)


def test_whole_rows_fallback_equals_the_dense_softmax(monkeypatch):
    """A bias that needs whole rows and cannot carry them is computed per query tile on whole rows."""
    dims = posenc.ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=2, train_length=16)
    scheme = posenc.build(posenc.default_config("cope"), dims, rngs=nnx.Rngs(0))
    monkeypatch.setattr(type(scheme), "traits", scheme.traits.replace(carries_bias=False))
    q, k = (jax.random.normal(jax.random.key(s), (2, T, 4, 8)) for s in (1, 2))
    pos = jnp.broadcast_to(jnp.arange(T), (2, T))
    tiled = jax.jit(lambda q, k: qk_statistics(q, k, pos, pos, scheme, BLOCK))
    dense = jax.jit(lambda q, k: dense_qk(q, k, pos, scheme))
    for got, want in zip(tiled(q, k), dense(q, k)):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)


class Diagonal(posenc.Scheme):
    """Not registered: a bias of -1e4 per token of distance, which leaves only the diagonal."""
    name = "diagonal"

    def bias(self, q, k, q_pos, k_pos):
        return -1e4 * (q_pos[:, None, :, None] - k_pos[:, None, None, :]).astype(jnp.float32)


def test_attention_forced_to_the_diagonal_has_zero_distance_and_entropy():
    dims = posenc.ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=2, train_length=16)
    scheme = Diagonal(posenc.base.NoOptions(), dims, rngs=nnx.Rngs(0))
    q, k = (10 * jax.random.normal(jax.random.key(s), (2, T, 4, 8)) for s in (1, 2))
    pos = jnp.broadcast_to(jnp.arange(T), (2, T))
    dist, ent = qk_statistics(q, k, pos, pos, scheme, BLOCK)
    np.testing.assert_allclose(dist, 0.0, atol=1e-6)
    np.testing.assert_allclose(ent, 0.0, atol=1e-5)


def test_uniform_attention_has_half_the_distance_and_log_entropy():
    model = make_model("nope")
    for blk in model.blocks:  # q = k = 0: every logit 0
        blk.attn.qkv.kernel[...] = jnp.zeros_like(blk.attn.qkv.kernel[...])
        blk.attn.qkv.bias[...] = jnp.zeros_like(blk.attn.qkv.bias[...])
    stats = attention_statistics(model, tokens(), block=BLOCK)
    i = np.arange(T)
    np.testing.assert_allclose(stats["mean_distance"], np.broadcast_to(i / 2, (2, 4, T)), atol=1e-4)
    np.testing.assert_allclose(stats["entropy"], np.broadcast_to(np.log(i + 1), (2, 4, T)), atol=1e-4)
    # one layer alone, any block width (wider than T included)
    x = jax.random.normal(jax.random.key(3), (1, T, CFG.d_model))
    pos = jnp.arange(T)[None]
    for block in (7, 64):
        dist, ent = jax.jit(lambda x: layer_statistics(model.blocks[0].attn, x, pos, block))(x)
        np.testing.assert_allclose(dist[0, 0], i / 2, atol=1e-4)
        np.testing.assert_allclose(ent[0, 0], np.log(i + 1), atol=1e-4)
