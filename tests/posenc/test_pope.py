"""PoPE against a transcription of x-transformers' `PolarEmbedding` / `apply_polar_pos_emb`
(lucidrains/x-transformers, x_transformers/x_transformers.py) and its attention logit, written out
here in numpy; and the triangular path's gradients with q and k wider than v (the Pallas kernel's:
tests/models/attention/test_pallas.py)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models.attention import tile_logits
from models.attention.dense import dense_attention
from models.attention.triangular import triangular_attention

H, K = 2, 8


def build(**options):
    cfg = posenc.default_config("pope")
    cfg.pope.update(options)
    dims = posenc.ModelDims(d_model=H * K, num_heads=H, head_dim=K, num_layers=1, train_length=16)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def softplus(x):
    return np.log1p(np.exp(x))


def reference_logits(q, k, t_q, t_k, learned_bias, base=10000.0):
    """q (h, i, d), k (h, j, d): `PolarEmbedding.forward` (freqs = t inv_freq, inv_freq = 1 /
    base^(arange(d) / d); bias = learned_bias clamped to [-2 pi, 0]), `apply_polar_pos_emb` (q with
    freqs, k with freqs + bias: cat(softplus(t) cos, softplus(t) sin)), then q k^T * dim_head^-0.5."""
    dim = q.shape[-1]
    inv_freq = 1.0 / base ** (np.arange(dim) / dim)
    bias = np.clip(learned_bias, -2 * np.pi, 0.0)[:, None, :]  # (heads, 1, dim)

    def apply_polar_pos_emb(t, freqs):
        t = softplus(t)
        return np.concatenate([t * np.cos(freqs), t * np.sin(freqs)], axis=-1)
    q_polar = apply_polar_pos_emb(q, np.einsum("i,j->ij", t_q, inv_freq)[None])
    k_polar = apply_polar_pos_emb(k, np.einsum("i,j->ij", t_k, inv_freq)[None] + bias)
    return np.einsum("hid,hjd->hij", q_polar, k_polar) * dim ** -0.5


def test_pope_logits_equal_x_transformers_and_depend_only_on_the_offset():
    scheme = build()
    bias = np.asarray(jax.random.uniform(jax.random.key(2), (H, K), minval=-8.0, maxval=2.0))  # clamp both ends
    scheme.phase_bias[...] = jnp.asarray(bias, jnp.float32)
    q = jax.random.normal(jax.random.key(0), (1, 7, H, K))
    k = jax.random.normal(jax.random.key(1), (1, 7, H, K))
    q_hid, k_hjd = (np.asarray(x[0], np.float64).swapaxes(0, 1) for x in (q, k))
    logits = []
    for start in (0, 300):
        pos = jnp.arange(7)[None] * 5 + start
        logits.append(tile_logits(*scheme.rotate(q, k, pos, pos), pos, pos, scheme)[0])
        t = np.asarray(pos[0], np.float64)
        np.testing.assert_allclose(logits[-1], reference_logits(q_hid, k_hjd, t, t, bias), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-3, atol=1e-3)  # the phase sees only s - t
    assert build(bias_init="uniform").phase_bias[...].min() < -1.0
    with pytest.raises(ValueError, match="pope.bias_init"):
        build(bias_init="ones")


def test_pope_gradients_through_the_triangular_path_equal_dense():
    """rotate doubles q and k's head size and not v's: the triangular path (what `auto` trains pope
    with) and its own backward pass follow v's. Gradients of q, k, v and the phase bias. (Blockwise,
    whose accumulator had q's head size, is checked forward for every scheme in test_blockwise.py.)"""
    scheme = build()
    scheme.phase_bias[...] = -0.5 * jnp.ones((H, K), jnp.float32)
    graphdef, state = nnx.split(scheme)
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 40, H, K)) for i in range(3))
    pos = jnp.broadcast_to(jnp.arange(40), (2, 40))
    weights = jnp.sin(jnp.arange(v.size, dtype=jnp.float32)).reshape(v.shape)
    paths = {"dense": lambda *a: dense_attention(*a, jnp.tril(jnp.ones((40, 40), bool))),
             "triangular": triangular_attention}

    def loss(attend, state, q, k, v):
        return (attend(q, k, v, pos, pos, nnx.merge(graphdef, state)) * weights).sum()
    grads = {name: jax.jit(jax.grad(lambda *a: loss(attend, *a), argnums=(0, 1, 2, 3)))(state, q, k, v)
             for name, attend in paths.items()}
    for a, b in zip(jax.tree.leaves(grads["dense"]), jax.tree.leaves(grads["triangular"])):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-4)
    assert float(jnp.abs(jax.tree.leaves(grads["dense"][0])[0]).max()) > 1e-3  # the phase bias learns
