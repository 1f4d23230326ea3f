"""Dense attention (one call of each hook over the whole T x S matrix) and what the other paths
share with it: NEG_INF, the logits of one tile, the attention-dropout pair, the value-term probe."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc import Scheme

NEG_INF = -1e30  # the logit of a masked (query, key) pair, for every attention path


def attends(q_idx, k_idx, window: int = 0):
    """Q x S: whether the query at sequence index q_idx may attend to the key at k_idx: the causal
    order (k_idx <= q_idx) and, with a `window` W > 0 (Mistral's sliding_window), q_idx - k_idx < W,
    the last W keys, itself included. Indices, not position values (a scheme may move positions).
    numpy or jax arrays alike (the triangular path builds its masks with numpy)."""
    causal = q_idx[:, None] >= k_idx[None, :]
    return causal & (q_idx[:, None] - k_idx[None, :] < window) if window else causal


@dataclasses.dataclass(frozen=True)
class Dropout:
    """Attention dropout: the rate, and the key to draw its mask from (None: evaluation, no dropout)."""
    rate: float = 0.0
    key: jax.Array | None = None

    @property
    def active(self) -> bool:
        return self.key is not None and self.rate > 0


NO_DROPOUT = Dropout()


def tile_logits(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme: Scheme,
                bias: jax.Array | None = None) -> jax.Array:
    """Logits of one (query block, key block) tile, float32 B x H x T x S: q k^T / sqrt(K), times
    the scheme's `logit_scale`, plus its `bias` (added after the scaling, as ALiBi specifies), or
    plus `bias` when given (a carried bias, computed by the caller)."""
    logits_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK,
                                preferred_element_type=jnp.float32) * q_BxTxHxK.shape[-1] ** -0.5
    scale = scheme.logit_scale(q_pos_BxT, k_pos_BxS)
    if scale is not None:
        logits_BxHxTxS = logits_BxHxTxS * scale
    if bias is None:
        bias = scheme.bias(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
    if bias is not None:
        logits_BxHxTxS = logits_BxHxTxS + bias
    return logits_BxHxTxS


def dense_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme: Scheme,
                    mask_TxS: jax.Array, dropout: Dropout = NO_DROPOUT) -> jax.Array:
    """softmax(scale * q k^T / sqrt(K) + bias) v (+ value bias), with one call of each hook.

    `mask_TxS` is True where a query may attend to a key (the causal order of the sequence, which
    is independent of the position values a scheme is given). Logits and softmax are float32.
    """
    q_BxTxHxK, k_BxSxHxK = scheme.rotate(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
    logits_BxHxTxS = jnp.where(mask_TxS, tile_logits(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme),
                               NEG_INF)
    probs_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1)
    if dropout.active:
        keep = jax.random.bernoulli(dropout.key, 1.0 - dropout.rate, probs_BxHxTxS.shape)
        probs_BxHxTxS = jnp.where(keep, probs_BxHxTxS / (1.0 - dropout.rate), 0.0)
    out_BxTxHxK = jnp.einsum("bhts,bshk->bthk", probs_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)
    value_term = scheme.value_bias(probs_BxHxTxS, q_pos_BxT, k_pos_BxS)
    if value_term is not None:
        out_BxTxHxK = out_BxTxHxK + value_term.astype(out_BxTxHxK.dtype)
    return out_BxTxHxK


def adds_value_term(scheme: Scheme, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> bool:
    """Whether the scheme's `value_bias` hook returns a term (probed on a 1 x 1 tile at trace time)."""
    probe = jnp.zeros((1, 1, 1, 1), jnp.float32)
    return scheme.value_bias(probe, q_pos_BxT[:1, :1], k_pos_BxS[:1, :1]) is not None


def fused_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                    window: int = 0) -> jax.Array:
    """Causal attention through `jax.nn.dot_product_attention` (cuDNN's fused kernel on GPU, an XLA
    composite elsewhere), for schemes whose positional signal is a rotation and / or an additive
    bias: no `logit_scale`, no `value_bias`. The bias is materialised for the whole sequence.
    `window` > 0: the last `window` keys only (its local_window_size)."""
    if (scheme.logit_scale(q_pos_BxT, k_pos_BxT) is not None or scheme.needs_full_rows
            or adds_value_term(scheme, q_pos_BxT, k_pos_BxT)):
        raise ValueError(f"positional scheme {scheme.name!r} scales logits, adds a value term or needs "
                         f"whole rows; model.attention=fused cannot express it: use dense or blockwise")
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    bias = scheme.bias(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    if bias is not None:
        b, t, h, _ = q_BxTxHxK.shape
        bias = jnp.broadcast_to(bias, (b, h, t, t)).astype(q_BxTxHxK.dtype)
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, bias=bias, is_causal=True,
                                        local_window_size=(window - 1, 0) if window else None)
