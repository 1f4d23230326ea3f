"""Causal self-attention that calls the positional scheme's hooks."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import Scheme

NEG_INF = -1e30


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
                    mask_TxS: jax.Array, dropout_rate: float = 0.0,
                    dropout_key: jax.Array | None = None) -> jax.Array:
    """softmax(scale * q k^T / sqrt(K) + bias) v (+ value bias), with one call of each hook.

    `mask_TxS` is True where a query may attend to a key (the causal order of the sequence, which
    is independent of the position values a scheme is given). Logits and softmax are float32.
    """
    q_BxTxHxK, k_BxSxHxK = scheme.rotate(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
    logits_BxHxTxS = jnp.where(mask_TxS, tile_logits(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme),
                               NEG_INF)
    probs_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1)
    if dropout_key is not None and dropout_rate > 0:
        keep = jax.random.bernoulli(dropout_key, 1.0 - dropout_rate, probs_BxHxTxS.shape)
        probs_BxHxTxS = jnp.where(keep, probs_BxHxTxS / (1.0 - dropout_rate), 0.0)
    out_BxTxHxK = jnp.einsum("bhts,bshk->bthk", probs_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)
    value_term = scheme.value_bias(probs_BxHxTxS, q_pos_BxT, k_pos_BxS)
    if value_term is not None:
        out_BxTxHxK = out_BxTxHxK + value_term.astype(out_BxTxHxK.dtype)
    return out_BxTxHxK


def needs_whole_rows(scheme: Scheme | type[Scheme]) -> bool:
    """Whether the scheme's bias needs all keys of a row at once: `needs_full_rows` without a
    `carried_bias` to carry it across key tiles (`carries_bias`). Such a scheme cannot run blockwise."""
    return scheme.needs_full_rows and not scheme.carries_bias


def is_long(length: int, block: int) -> bool:
    """Sequences this long are evaluated tile by tile (attention) and chunk by chunk (the MLP)."""
    return length > 2 * block


def attention_path(kind: str, block: int, scheme: Scheme | type[Scheme], length: int, *,
                   dropping: bool = False, triangular: bool = False, pallas: bool = False) -> str:
    """The attention implementation for one sequence length: `kind` ('auto' or an explicit
    model.attention) resolved to 'dense' | 'triangular' | 'blockwise' | 'fused' | 'pallas'. 'auto'
    takes the Pallas kernel where `pallas` (on GPU, for a scheme it expresses: any length, dropout
    included), else blockwise for long sequences (`is_long`) unless attention dropout is on or the scheme needs
    whole rows; otherwise the triangular path where `triangular` (it supports the scheme and the
    scheme does no per-key work), else dense. The decoder and the evaluation batch policy both ask here."""
    if kind != "auto":
        return kind
    if pallas:
        return "pallas"
    if is_long(length, block) and not dropping and not needs_whole_rows(scheme):
        return "blockwise"
    if triangular and not scheme.bias_work_per_key:
        return "triangular"
    return "dense"


def adds_value_term(scheme: Scheme, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> bool:
    """Whether the scheme's `value_bias` hook returns a term (probed on a 1 x 1 tile at trace time)."""
    probe = jnp.zeros((1, 1, 1, 1), jnp.float32)
    return scheme.value_bias(probe, q_pos_BxT[:1, :1], k_pos_BxS[:1, :1]) is not None


def fused_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme) -> jax.Array:
    """Causal attention through `jax.nn.dot_product_attention` (cuDNN's fused kernel on GPU, an XLA
    composite elsewhere), for schemes whose positional signal is a rotation and / or an additive
    bias: no `logit_scale`, no `value_bias`. The bias is materialised for the whole sequence."""
    if (scheme.logit_scale(q_pos_BxT, k_pos_BxT) is not None or scheme.needs_full_rows
            or adds_value_term(scheme, q_pos_BxT, k_pos_BxT)):
        raise ValueError(f"positional scheme {scheme.name!r} scales logits, adds a value term or needs "
                         f"whole rows; model.attention=fused cannot express it: use dense or blockwise")
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    bias = scheme.bias(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    if bias is not None:
        b, t, h, _ = q_BxTxHxK.shape
        bias = jnp.broadcast_to(bias, (b, h, t, t)).astype(q_BxTxHxK.dtype)
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, bias=bias, is_causal=True)


def blockwise_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                        block_size: int = 512) -> jax.Array:
    """Causal self-attention in (query block, key block) tiles with an online softmax.

    Memory is O(T * block) instead of O(T^2): only one B x H x block x block tile of logits exists
    at a time. Key blocks after the query block's diagonal are skipped (`lax.cond`, which keeps the
    function differentiable). `rotate` runs once on the whole sequence (it is per position); `bias`,
    `logit_scale` and `value_bias` run per tile. `value_bias` must be linear in the probabilities
    (true of Shaw et al.'s value term): it is accumulated with the same rescaling as the output.
    A scheme whose bias needs whole rows (`needs_full_rows`, e.g. CoPE) provides instead
    `carried_bias(q, k, q_pos, k_pos, carry_BxHxQ) -> (bias, carry)`: key tiles are then visited
    from the diagonal down to the first (the online softmax does not mind the order), with a
    per-query carry that starts at zero. Numerically equal to `dense_attention` up to float32
    rounding.
    """
    if needs_whole_rows(scheme):
        raise ValueError(f"positional scheme {scheme.name!r} needs whole rows of keys for its bias and has no "
                         f"carried_bias; set --config.model.attention=dense (or auto)")
    carried = scheme.needs_full_rows  # and so `carries_bias`
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    b, t, h, d = q_BxTxHxK.shape
    nb = -(-t // block_size)
    pad = nb * block_size - t

    def blocks(x, fill=0):  # B x T x ... -> NB x B x block x ...
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        return jnp.moveaxis(x.reshape(b, nb, block_size, *x.shape[2:]), 1, 0)

    qb, kb, vb = blocks(q_BxTxHxK), blocks(k_BxTxHxK), blocks(v_BxTxHxK)
    # padded keys get a position after every query, so that a carried bias (gates) ignores them
    qpb, kpb = blocks(q_pos_BxT), blocks(k_pos_BxT, fill=jnp.iinfo(jnp.int32).max if carried else 0)
    idx = jnp.arange(block_size)

    def one_query_block(i):
        q, q_pos = qb[i], qpb[i]

        def tile(carry, step):
            j = nb - 1 - step if carried else step  # carried biases see key tiles right to left

            def compute(carry):
                m_BxHxQ, l_BxHxQ, acc_BxQxHxK, row_BxHxQ = carry
                k, v, k_pos = kb[j], vb[j], kpb[j]
                bias = None
                if carried:
                    bias, row_BxHxQ = scheme.carried_bias(q, k, q_pos, k_pos, row_BxHxQ)
                s = tile_logits(q, k, q_pos, k_pos, scheme, bias)
                q_idx, k_idx = i * block_size + idx, j * block_size + idx
                allowed = (q_idx[:, None] >= k_idx[None, :]) & (k_idx[None, :] < t)
                s = jnp.where(allowed, s, NEG_INF)
                m_new = jnp.maximum(m_BxHxQ, s.max(-1))
                p = jnp.exp(s - m_new[..., None])
                correction = jnp.exp(m_BxHxQ - m_new)
                l_new = l_BxHxQ * correction + p.sum(-1)
                out = jnp.einsum("bhts,bshk->bthk", p.astype(v.dtype), v).astype(jnp.float32)
                value_term = scheme.value_bias(p, q_pos, k_pos)
                if value_term is not None:
                    out = out + value_term.astype(jnp.float32)
                acc = acc_BxQxHxK * jnp.moveaxis(correction, 1, 2)[..., None] + out
                return m_new, l_new, acc, row_BxHxQ
            return jax.lax.cond(j <= i, compute, lambda c: c, carry), None

        init = (jnp.full((b, h, block_size), NEG_INF, jnp.float32), jnp.zeros((b, h, block_size), jnp.float32),
                jnp.zeros((b, block_size, h, d), jnp.float32), jnp.zeros((b, h, block_size), jnp.float32))
        (m, l, acc, _), _ = jax.lax.scan(tile, init, jnp.arange(nb))
        return (acc / jnp.moveaxis(l, 1, 2)[..., None]).astype(v_BxTxHxK.dtype)

    out_NBxBxQxHxK = jax.lax.map(one_query_block, jnp.arange(nb))
    return jnp.moveaxis(out_NBxBxQxHxK, 0, 1).reshape(b, nb * block_size, h, d)[:, :t]
