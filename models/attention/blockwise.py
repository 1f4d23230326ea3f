"""Blockwise attention: causal self-attention tile by tile with an online softmax, O(T * block)
memory, for long evaluation (what `auto` picks beyond two attention blocks, see choice.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.attention.lambda_mask import LambdaMask, sink_branch, sink_logits
from models.attention.stickbreaking import stickbreaking_blockwise
from models.attention.tiles import NEG_INF, context_tiles, tile_logits, to_blocks
from posenc import Scheme


def _softmax_update(state, s_BxHxQxS, v_BxSxHxK, value_term):
    """One tile of the online softmax: (m, l, acc, row) with the tile's masked logits and values
    added; `value_term(p)` is the scheme's value term of the tile's unnormalised probabilities."""
    m_BxHxQ, l_BxHxQ, acc_BxQxHxK, row_BxHxQ = state
    m_new = jnp.maximum(m_BxHxQ, s_BxHxQxS.max(-1))
    p = jnp.exp(s_BxHxQxS - m_new[..., None])
    correction = jnp.exp(m_BxHxQ - m_new)
    l_new = l_BxHxQ * correction + p.sum(-1)
    out = jnp.einsum("bhts,bshk->bthk", p.astype(v_BxSxHxK.dtype), v_BxSxHxK).astype(jnp.float32)
    extra = value_term(p)
    if extra is not None:
        out = out + extra.astype(jnp.float32)
    acc = acc_BxQxHxK * jnp.moveaxis(correction, 1, 2)[..., None] + out
    return m_new, l_new, acc, row_BxHxQ


def blockwise_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                        block_size: int = 512, *, context_BxTxC: jax.Array | None = None,
                        mask: LambdaMask | None = None) -> jax.Array:
    """Causal self-attention in (query block, key block) tiles with an online softmax.

    Memory is O(T * block) instead of O(T^2): only one B x H x block x block tile of logits exists
    at a time. Key blocks after the query block's diagonal are skipped (`lax.cond`, which keeps the
    function differentiable). `rotate` runs once on the whole sequence (it is per position); `bias`,
    `logit_scale` and `value_bias` run per tile. `value_bias` must be linear in the probabilities
    (true of Shaw et al.'s value term): it is accumulated with the same rescaling as the output.
    A scheme whose bias needs whole rows (`needs_full_rows`, e.g. CoPE) provides instead
    `carried_bias(q, k, q_pos, k_pos, carry_BxHxQ) -> (bias, carry)`: key tiles are then visited
    from the diagonal down to the first (the online softmax does not mind the order), with a
    per-query carry that starts at zero. A scheme that reads the layer's input gets its
    `token_context` (`context_BxTxC`, computed once over the whole sequence) cut into the same
    tiles. Under LM-Infinite's Lambda `mask` (lambda_mask.py) only the key tiles that meet each
    query tile's window are visited, then one tile of the sink keys. A stick-breaking scheme runs
    its own recurrence (stickbreaking.py). Numerically equal to `dense_attention` up to float32
    rounding. What it refuses (a whole-row bias it cannot carry; under the mask, schemes without
    a window to cut) is its row in paths.py.
    """
    if scheme.traits.normalization == "stickbreaking":
        return stickbreaking_blockwise(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme, block_size,
                                       context_BxTxC)
    carried = scheme.traits.needs_full_rows  # and so `carries_bias`
    sinks = None
    if mask is not None and mask.sinks:
        sinks = sink_branch(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme, mask, context_BxTxC)
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    b, t, h, _ = q_BxTxHxK.shape
    d = v_BxTxHxK.shape[-1]  # the output's head size (`rotate` may widen q and k: PoPE)
    nb = -(-t // block_size)
    qb, kb, vb = (to_blocks(x, block_size) for x in (q_BxTxHxK, k_BxTxHxK, v_BxTxHxK))
    # padded keys get a position after every query, so that a carried bias (gates) ignores them
    qpb = to_blocks(q_pos_BxT, block_size)
    kpb = to_blocks(k_pos_BxT, block_size, fill=jnp.iinfo(jnp.int32).max if carried else 0)
    cb = context_tiles(context_BxTxC, block_size)
    idx = jnp.arange(block_size)
    steps = nb if mask is None else min(nb, mask.window_tiles(block_size))
    if sinks is not None:
        sink_qb, sink_qpb = to_blocks(sinks.q, block_size), to_blocks(sinks.q_pos, block_size)

    def one_query_block(i):
        q, q_pos = qb[i], qpb[i]
        q_idx = i * block_size + idx

        def tile(carry, step):
            if carried:  # carried biases see key tiles right to left
                j = nb - 1 - step
            else:        # under a Lambda mask, only the window's tiles: i - steps + 1 .. i
                j = step if mask is None else i - steps + 1 + step

            def compute(carry):
                k, v, k_pos = kb[j], vb[j], kpb[j]
                row_BxHxQ, bias = carry[3], None
                if carried:
                    bias, row_BxHxQ = scheme.carried_bias(q, k, q_pos, k_pos, row_BxHxQ)
                context = None if cb is None else (cb[i], cb[j])
                s = tile_logits(q, k, q_pos, k_pos, scheme, bias, context)
                k_idx = j * block_size + idx
                allowed = (q_idx[:, None] >= k_idx[None, :]) & (k_idx[None, :] < t)
                if mask is not None:
                    allowed = allowed & mask.local(q_idx, k_idx)
                s = jnp.where(allowed, s, NEG_INF)
                state = (*carry[:3], row_BxHxQ)
                return _softmax_update(state, s, v, lambda p: scheme.value_bias(p, q_pos, k_pos))
            visited = j <= i if mask is None else j >= 0
            return jax.lax.cond(visited, compute, lambda c: c, carry), None

        init = (jnp.full((b, h, block_size), NEG_INF, jnp.float32), jnp.zeros((b, h, block_size), jnp.float32),
                jnp.zeros((b, block_size, h, d), jnp.float32), jnp.zeros((b, h, block_size), jnp.float32))
        state, _ = jax.lax.scan(tile, init, jnp.arange(steps))
        if sinks is not None:  # last, once the running maximum is a real logit
            sq, sqp = sink_qb[i], sink_qpb[i]
            s = sink_logits(sinks, scheme, mask, sq, sqp, q_idx, None if cb is None else cb[i])
            state = _softmax_update(state, s, sinks.v, lambda p: scheme.value_bias(p, sqp, sinks.k_pos))
        m, l, acc, _ = state
        return (acc / jnp.moveaxis(l, 1, 2)[..., None]).astype(v_BxTxHxK.dtype)

    out_NBxBxQxHxK = jax.lax.map(one_query_block, jnp.arange(nb))
    return jnp.moveaxis(out_NBxBxQxHxK, 0, 1).reshape(b, nb * block_size, h, d)[:, :t]
