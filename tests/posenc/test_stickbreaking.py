"""Stick-breaking attention against a transcription of the authors' reference (sb_ref.py with the
remainder as tests/test_attn.py adds it), dense and blockwise, and what refuses it."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc
from models.attention import blockwise_attention, choice, dense_attention
from models.attention.paths import PATHS, CallSpec
from models.config import ModelConfig
from tests.posenc.helpers import build_with as build, positions

DIMS = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_length=16)


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def _reference_stickbreaking(q, k, v, attend_current, remainder):
    """shawntan/stickbreaking-attention, stickbreaking_attention/sb_ref.py, written out: logits =
    q k^T / sqrt(d); log_z = logsigmoid(logits) masked to -1e5, log_beta = logsigmoid(-logits)
    masked to 0 (mask = triu(0), or triu(1) attending to the current key); re_cum_log_beta =
    log_beta @ tril(ones, -1); att = exp(log_z + re_cum_log_beta); o = att v, rem = 1 - sum att;
    tests/test_attn.py's ref_fwd returns o + rem v."""
    b, t, h, d = q.shape
    logits = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(d)
    mask = np.triu(np.ones((t, t), bool), 1 if attend_current else 0)
    log_z = np.where(mask, -1e5, _log_sigmoid(logits))
    log_beta = np.where(mask, 0.0, _log_sigmoid(-logits))
    re_cum_log_beta = np.einsum("bhij,jk->bhik", log_beta, np.tril(np.ones((t, t)), -1))
    att = np.exp(log_z + re_cum_log_beta)
    out = np.einsum("bhts,bshk->bthk", att, v)
    rem = 1.0 - att.sum(-1)
    return out + np.moveaxis(rem, 1, 2)[..., None] * v if remainder == "value" else out


@pytest.mark.parametrize("attend_current,remainder", [(False, "value"), (True, "none")])
def test_stickbreaking_is_the_references_dense_and_blockwise(attend_current, remainder):
    scheme = build("stickbreaking", DIMS, stickbreaking__attend_current=attend_current,
                   stickbreaking__remainder=remainder)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (2 * jax.random.normal(kk, (2, 11, 2, 8)) for kk in keys)
    pos = positions(2, 11)
    expected = _reference_stickbreaking(*(np.asarray(a, np.float64) for a in (q, k, v)), attend_current, remainder)
    dense = dense_attention(q, k, v, pos, pos, scheme, jnp.tril(jnp.ones((11, 11), bool)))
    np.testing.assert_allclose(dense, expected, atol=2e-5)
    np.testing.assert_allclose(blockwise_attention(q, k, v, pos, pos, scheme, 4), expected, atol=2e-5)
    if not attend_current:  # the first token has no key before it: all of its stick is left over
        np.testing.assert_allclose(dense[:, 0], v[:, 0], atol=1e-6)


def test_stickbreaking_refuses_dropout_and_a_bad_remainder():
    scheme = build("stickbreaking", DIMS)
    for path in ("auto", "dense"):
        with pytest.raises(ValueError, match="'stickbreaking' \\(stick-breaking attention\\).*attention_dropout=0"):
            choice.choose(ModelConfig(attention=path), scheme, positions(1, 4), jnp.float32, dropping=True)
    with pytest.raises(ValueError, match="stickbreaking.remainder must be one of value, none"):
        build("stickbreaking", DIMS, stickbreaking__remainder="bias")


def test_the_pallas_kernel_refuses_every_scheme_that_is_more_than_a_positional_bias():
    """FoX (a bias from the input), DAPE (a logit transform) and stick-breaking (not a softmax): the
    kernel's row (paths.py) refuses them, so `auto` never picks it for them on a GPU, and an explicit
    model.attention=pallas is refused."""
    pos = positions(1, 8)
    for name in ("fox", "dape", "stickbreaking"):
        scheme = build(name, DIMS)
        assert PATHS["pallas"].accepts(scheme.traits, CallSpec(name, 8, 16, "float32")) is not None
        with pytest.raises(ValueError, match="model.attention=pallas cannot express it"):
            choice.choose(ModelConfig(attention="pallas"), scheme, pos, jnp.float32, dropping=False)
