"""Dense attention (one call of each hook over the whole T x S matrix) and what the other paths
share with it: NEG_INF and the logits of one tile (from tiles.py), the attention-dropout pair (from
call.py), values padded to the head size of q and k."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.attention.call import NO_DROPOUT, Call, Dropout
from models.attention.stickbreaking import stickbreaking_dense
from models.attention.tiles import NEG_INF, tile_logits
from posenc import Scheme

__all__ = ["NEG_INF", "NO_DROPOUT", "Dropout", "dense_attention", "dense_call", "padded_values", "tile_logits"]


def dense_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme: Scheme, mask_TxS: jax.Array, *,
                    context_BxTxC: jax.Array | None = None) -> jax.Array:
    """`dense_call` of a call at these positions without dropout (and the scheme's token context)."""
    return dense_call(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, Call(q_pos_BxT, k_pos_BxS, scheme, context=context_BxTxC), mask_TxS)


def dense_call(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, call: Call, mask_TxS: jax.Array) -> jax.Array:
    """softmax(scale * q k^T / sqrt(K) + bias) v (+ value bias), with one call of each hook, the
    probabilities dropped as `call.dropout` says.

    `mask_TxS` is True where a query may attend to a key (the causal order of the sequence, which
    is independent of the position values a scheme is given). Logits and softmax are float32.
    `context_BxTxC`: the scheme's `token_context` of the layer's input (self-attention), where it
    reads one. A stick-breaking scheme (`traits.normalization`) runs its own causal recurrence instead
    (stickbreaking.py; causal self-attention, no dropout: paths.py refuses it).
    """
    q_pos_BxT, k_pos_BxS, scheme, dropout, context_BxTxC = call.q_pos, call.k_pos, call.scheme, call.dropout, call.context
    if scheme.traits.normalization == "stickbreaking":
        return stickbreaking_dense(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme, context_BxTxC)
    q_BxTxHxK, k_BxSxHxK = scheme.rotate(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
    context = None if context_BxTxC is None else (context_BxTxC, context_BxTxC)
    logits_BxHxTxS = jnp.where(mask_TxS, tile_logits(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme,
                                                     context=context), NEG_INF)
    probs_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1)
    if dropout.active:
        keep = jax.random.bernoulli(dropout.key, 1.0 - dropout.rate, probs_BxHxTxS.shape)
        probs_BxHxTxS = jnp.where(keep, probs_BxHxTxS / (1.0 - dropout.rate), 0.0)
    out_BxTxHxK = jnp.einsum("bhts,bshk->bthk", probs_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)
    value_term = scheme.value_bias(probs_BxHxTxS, q_pos_BxT, k_pos_BxS)
    if value_term is not None:
        out_BxTxHxK = out_BxTxHxK + value_term.astype(out_BxTxHxK.dtype)
    return out_BxTxHxK


def padded_values(v_BxSxHxK: jax.Array, width: int) -> jax.Array:
    """v with zero features appended up to `width`, the head size of the rotated q and k, for the
    kernels that take one head size for q, k and v: a scheme's `rotate` may widen q and k (PoPE
    doubles them). The first K features of the output are the attention output, the rest zero."""
    extra = width - v_BxSxHxK.shape[-1]
    return v_BxSxHxK if extra == 0 else jnp.pad(v_BxSxHxK, [(0, 0)] * 3 + [(0, extra)])
