"""The triangular attention path (row tiles below the diagonal, hand-written backward pass) against
dense attention: values for every scheme, gradients for a set of hook kinds, and dropout."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.attention.paths import PATHS, CallSpec
from models.attention.triangular import _tile_attention, tile_size
from models.config import ModelConfig

CFG = dict(vocab_size=37, num_layers=1, d_model=32, num_heads=4, mlp_dim=64)
T = 70  # two row tiles of 64 and 6 rows: an uneven last tile


def pair(name, train_length=80):
    return [DecoderLM(ModelConfig(**CFG, attention=kind), posenc.default_config(name),
                      train_length=train_length, rngs=nnx.Rngs(0)) for kind in ("dense", "triangular")]


def tokens(seed=1, t=T):
    return jax.random.randint(jax.random.key(seed), (3, t), 0, CFG["vocab_size"])


def test_tile_size_policy():
    assert tile_size(T) == 64 and tile_size(256) == 64 and tile_size(512) == 128 and tile_size(4096) == 128
    assert tile_size(8) == 64  # one tile when the sequence is short


@pytest.mark.parametrize("name", posenc.names())
def test_triangular_equals_dense_or_refuses_clearly(name):
    dense, tri = pair(name)
    x = tokens()
    if PATHS["triangular"].accepts(tri.scheme.traits, CallSpec(name, T, 16, "float32")):
        with pytest.raises(ValueError, match=f"{name}.*triangular cannot express it"):
            tri(x)
        return
    np.testing.assert_allclose(tri(x), dense(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "t5", "rope", "logn", "kerple_log", "transformer_xl", "tupe"])
def test_triangular_gradients_equal_dense(name):
    """Covers a rotation, fixed and learned biases, a per-query logit scale and a content bias."""
    dense, tri = pair(name)
    x = tokens()
    grads = [jax.jit(jax.grad(lambda m: m.token_nll(x, x).mean()))(m) for m in (dense, tri)]
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("start", [0, 16])
def test_tile_backward_with_dropout_and_bias_equals_autodiff(start):
    """The custom backward pass (dS = P * (dP - rowsum(dO * O))) against JAX's autodiff of the same
    forward formula, with the same dropout mask and a bias that receives a gradient."""
    b, h, q_rows, s, d, rate = 2, 3, 8, start + 8, 4, 0.25
    keys = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(keys[0], (b, h, q_rows, d))
    k, v = (jax.random.normal(kk, (b, h, s, d)) for kk in keys[1:3])
    bias = jax.random.normal(keys[3], (1, h, q_rows, s))
    keep = jax.random.bernoulli(keys[4], 1 - rate, (b, h, q_rows, s))
    mask = (start + np.arange(q_rows))[:, None] >= np.arange(s)[None, :]

    def reference(q, k, v, bias):
        logits = jnp.where(mask, jnp.einsum("bhqk,bhsk->bhqs", q, k) + bias, -1e30)
        p = jax.nn.softmax(logits, -1)
        return jnp.einsum("bhqs,bhsk->bhqk", jnp.where(keep, p / (1 - rate), 0.0), v)

    def loss(fn):
        return lambda *args: (fn(*args) * jnp.cos(jnp.arange(d))).sum()

    ours = lambda q, k, v, bias: _tile_attention(start, rate, q, k, v, bias, keep)
    np.testing.assert_allclose(ours(q, k, v, bias), reference(q, k, v, bias), atol=1e-5)
    g_ours = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2, 3)))(q, k, v, bias)
    g_ref = jax.jit(jax.grad(loss(reference), argnums=(0, 1, 2, 3)))(q, k, v, bias)
    for a, r in zip(g_ours, g_ref):
        np.testing.assert_allclose(a, r, atol=1e-5, rtol=1e-5)


def test_triangular_trains_with_attention_dropout():
    cfg = ModelConfig(**CFG, attention="triangular", attention_dropout=0.5)
    model = DecoderLM(cfg, posenc.default_config("alibi"), train_length=80, rngs=nnx.Rngs(0))
    x = tokens()
    a = model.token_nll(x, x, dropout_key=jax.random.key(0))
    b = model.token_nll(x, x, dropout_key=jax.random.key(1))
    assert not np.allclose(a, b)  # dropout is applied, and differs per key
    np.testing.assert_allclose(model.token_nll(x, x), model.token_nll(x, x))  # none without a key
