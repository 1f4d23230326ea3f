"""FoX (the Forgetting Transformer) against a transcription of the authors' forgetting attention,
its bias read tile by tile from the running sum, and its gradients through the training path."""
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from models import DecoderLM
from models.attention import blockwise_attention, dense_attention
from models.config import ModelConfig
from tests.posenc.helpers import DIMS, build_with as build, positions


def _reference_forgetting_attention(x, q, k, v, w, b):
    """zhixuan-lin/forgetting-transformer, written out one (query, key) pair at a time:
    fgate_logit = x W + b, log_fgate = logsigmoid(.), log_lambda = cumsum(log_fgate), then causal
    softmax(q . k / sqrt(d) + log_lambda_i - log_lambda_j) v."""
    bsz, t, h, d = q.shape
    log_f = -np.log1p(np.exp(-(np.einsum("btd,dh->bth", x, w) + b)))
    out = np.zeros_like(v)
    for bi in range(bsz):
        for hi in range(h):
            for i in range(t):
                logits = np.array([q[bi, i, hi] @ k[bi, j, hi] / math.sqrt(d) + sum(log_f[bi, j + 1:i + 1, hi])
                                   for j in range(i + 1)])
                p = np.exp(logits - logits.max())
                out[bi, i, hi] = (p / p.sum()) @ v[bi, :i + 1, hi]
    return out


def test_fox_attention_is_the_references_forgetting_attention():
    scheme = build("fox", fox__gate_bias_init=1.0)
    scheme.gate_w[...] = jax.random.normal(jax.random.key(9), scheme.gate_w.shape)  # gates far from 1/2
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (2, 9, DIMS.d_model))
    q, k, v = (jax.random.normal(kk, (2, 9, 2, 8)) for kk in keys[1:])
    pos = positions(2, 9)
    context = scheme.token_context(x, pos)
    mask = jnp.tril(jnp.ones((9, 9), bool))
    expected = _reference_forgetting_attention(*(np.asarray(a, np.float64) for a in (x, q, k, v)),
                                               np.asarray(scheme.gate_w[...], np.float64),
                                               np.asarray(scheme.gate_b[...], np.float64))
    np.testing.assert_allclose(dense_attention(q, k, v, pos, pos, scheme, mask, context_BxTxC=context), expected,
                               atol=2e-5)
    np.testing.assert_allclose(blockwise_attention(q, k, v, pos, pos, scheme, 4, context_BxTxC=context), expected,
                               atol=2e-5)  # tiles of 4 over 9 tokens: the running sum is cut, not restarted


def test_fox_bias_of_a_tile_is_that_block_of_the_full_bias_at_any_offset():
    scheme = build("fox")
    x = jax.random.normal(jax.random.key(1), (1, 12, DIMS.d_model))
    for start in (0, 100):  # a window that starts elsewhere: the same gates, the same bias
        pos = positions(1, 12, start)
        c = scheme.token_context(x, pos)
        full = scheme.context_bias(c, c, pos, pos)
        tile = scheme.context_bias(c[:, 4:8], c[:, 2:6], pos[:, 4:8], pos[:, 2:6])
        np.testing.assert_allclose(full[:, :, 4:8, 2:6], tile, atol=1e-6)
        log_f = np.asarray(scheme.log_forget(x))[0]
        np.testing.assert_allclose(full[0, :, 7, 3], log_f[4:8].sum(0), atol=1e-5)  # l in (3, 7]
    assert scheme.gate_w.shape == (DIMS.d_model, 2) and float(jnp.abs(scheme.gate_b[...]).max()) == 0.0
    assert float(build("fox", fox__gate_bias_init=5.0).gate_b[0]) == 5.0  # x-transformers' start


def test_fox_trains_through_the_triangular_path_with_the_gates_gradients():
    """auto trains FoX on the triangular path: its hand-written backward pass passes dS to the bias,
    and so to the gates; equal to dense attention's autodiff."""
    cfg = dict(vocab_size=37, num_layers=1, d_model=16, num_heads=2, mlp_dim=32)
    x = jax.random.randint(jax.random.key(2), (2, 20), 0, 37)
    grads = []
    for kind in ("dense", "triangular"):
        model = DecoderLM(ModelConfig(**cfg, attention=kind), posenc.default_config("fox"), train_length=20,
                          rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        grads.append(jax.jit(jax.grad(lambda s: nnx.merge(graphdef, s).token_nll(x, x).mean()))(state))
    gate = [g["blocks"][0]["attn"]["scheme"]["gate_w"][...] for g in grads]
    assert float(jnp.abs(gate[0]).max()) > 1e-4
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-4)
