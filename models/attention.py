"""Causal self-attention that calls the positional scheme's hooks."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import Scheme

NEG_INF = -1e30


def dense_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme: Scheme,
                    mask_TxS: jax.Array, dropout_rate: float = 0.0,
                    dropout_key: jax.Array | None = None) -> jax.Array:
    """softmax(scale * q k^T / sqrt(K) + bias) v (+ value bias), with one call of each hook.

    `mask_TxS` is True where a query may attend to a key (the causal order of the sequence, which
    is independent of the position values a scheme is given). Logits and softmax are float32.
    """
    q_BxTxHxK, k_BxSxHxK = scheme.rotate(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
    head_dim = q_BxTxHxK.shape[-1]
    logits_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK,
                                preferred_element_type=jnp.float32) * head_dim ** -0.5
    scale = scheme.logit_scale(q_pos_BxT, k_pos_BxS)
    if scale is not None:
        logits_BxHxTxS = logits_BxHxTxS * scale
    bias = scheme.bias(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
    if bias is not None:
        logits_BxHxTxS = logits_BxHxTxS + bias
    logits_BxHxTxS = jnp.where(mask_TxS, logits_BxHxTxS, NEG_INF)
    probs_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1)
    if dropout_key is not None and dropout_rate > 0:
        keep = jax.random.bernoulli(dropout_key, 1.0 - dropout_rate, probs_BxHxTxS.shape)
        probs_BxHxTxS = jnp.where(keep, probs_BxHxTxS / (1.0 - dropout_rate), 0.0)
    out_BxTxHxK = jnp.einsum("bhts,bshk->bthk", probs_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)
    value_term = scheme.value_bias(probs_BxHxTxS, q_pos_BxT, k_pos_BxS)
    if value_term is not None:
        out_BxTxHxK = out_BxTxHxK + value_term.astype(out_BxTxHxK.dtype)
    return out_BxTxHxK
