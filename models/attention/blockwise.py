"""Blockwise attention: causal self-attention tile by tile with an online softmax, O(T * block)
memory, for long evaluation (what `auto` picks beyond two attention blocks, see choice.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.attention.dense import NEG_INF, attends, tile_logits
from posenc import Scheme


def needs_whole_rows(scheme: Scheme | type[Scheme]) -> bool:
    """Whether the scheme's bias needs all keys of a row at once: `needs_full_rows` without a
    `carried_bias` to carry it across key tiles (`carries_bias`). Such a scheme cannot run blockwise."""
    return scheme.needs_full_rows and not scheme.carries_bias


def blockwise_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                        block_size: int = 512, window: int = 0) -> jax.Array:
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
    rounding. `window` > 0: each query attends to the last `window` keys only (`attends`).
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
                allowed = attends(q_idx, k_idx, window) & (k_idx[None, :] < t)
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
