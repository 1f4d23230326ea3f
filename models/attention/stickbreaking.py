"""Stick-breaking attention (Tan et al., ICLR 2025): attention weights from a stick-breaking process
instead of a softmax, for schemes whose `traits.normalization` is "stickbreaking" (posenc/stickbreaking.py).

With z_ij the tile logits (q_i . k_j / sqrt(K) and any hook of the scheme) and beta_ij = sigmoid(z_ij),
query i breaks off beta_ij of what is left of its stick at each key, nearest key first:

    A_ij = beta_ij * prod_{j < k <= i'} (1 - beta_ik)      in logs: log sigmoid(z_ij) + sum_{j<k} log sigmoid(-z_ik)

over the keys the query sees (k < i, or k <= i with `attend_current`; i' the last of them). The
stick left over, 1 - sum_j A_ij, goes to the query's own value (`remainder="value"`, as the authors'
reference test `o + rem * v`) or nowhere ("none"). No exponential of a positive number is taken,
so there is no running maximum to keep.

The recurrence runs from the diagonal to the first key, so the blockwise form visits key tiles right
to left carrying, per query, the summed log sigmoid(-z) of the keys after the tile (as CoPE carries
its gates): one B x H x block x block tile at a time, O(T x block) memory, tiles above the diagonal
skipped. The dense form is the same computation on one whole-row tile.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.attention.tiles import context_tiles, tile_logits, to_blocks
from posenc import Scheme


def options(scheme: Scheme):
    """The stick-breaking scheme's options (`attend_current`, `remainder`), through any wrappers."""
    while getattr(scheme, "inner", None) is not None:
        scheme = scheme.inner
    return scheme.options


def stick_weights(z_BxHxQxS: jax.Array, allowed_QxS: jax.Array, log_after_BxHxQ: jax.Array):
    """(A, log_left): the weights of one tile of logits given log_after, the summed log (1 - beta) of
    each query's keys after the tile (0 for the rightmost tile), and log_after extended by this tile."""
    log_beta = jnp.where(allowed_QxS, jax.nn.log_sigmoid(z_BxHxQxS), 0.0)
    log_fail = jnp.where(allowed_QxS, jax.nn.log_sigmoid(-z_BxHxQxS), 0.0)
    from_here = jnp.flip(jnp.cumsum(jnp.flip(log_fail, -1), axis=-1), -1)  # sum over keys k >= j
    after = jnp.concatenate([from_here[..., 1:], jnp.zeros_like(from_here[..., :1])], axis=-1)  # k > j
    weights = jnp.where(allowed_QxS, jnp.exp(log_beta + after + log_after_BxHxQ[..., None]), 0.0)
    return weights, log_after_BxHxQ + from_here[..., 0]


def _finish(acc_BxQxHxK, mass_BxHxQ, v_BxQxHxK, remainder: str):
    if remainder == "value":
        acc_BxQxHxK = acc_BxQxHxK + jnp.moveaxis(1.0 - mass_BxHxQ, 1, 2)[..., None] * v_BxQxHxK.astype(jnp.float32)
    return acc_BxQxHxK


def _allowed(q_idx, k_idx, attend_current: bool):
    return q_idx[:, None] >= k_idx[None, :] if attend_current else q_idx[:, None] > k_idx[None, :]


def stickbreaking_dense(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                        context_BxTxC=None) -> jax.Array:
    """Causal stick-breaking attention over whole rows (the B x H x T x T weights at once)."""
    opts = options(scheme)
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    b, t, h, _ = q_BxTxHxK.shape
    context = None if context_BxTxC is None else (context_BxTxC, context_BxTxC)
    z = tile_logits(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme, context=context)
    idx = jnp.arange(t)
    weights, _ = stick_weights(z, _allowed(idx, idx, opts.attend_current), jnp.zeros((b, h, t), jnp.float32))
    out = jnp.einsum("bhts,bshk->bthk", weights, v_BxTxHxK.astype(jnp.float32))
    return _finish(out, weights.sum(-1), v_BxTxHxK, opts.remainder).astype(v_BxTxHxK.dtype)


def stickbreaking_blockwise(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                            block_size: int = 512, context_BxTxC=None) -> jax.Array:
    """Causal stick-breaking attention in (query block, key block) tiles, key tiles right to left
    with each query's summed log (1 - beta) carried; equal to `stickbreaking_dense` up to float32
    rounding."""
    opts = options(scheme)
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    b, t, h, d = q_BxTxHxK.shape
    nb = -(-t // block_size)
    qb, kb, vb = (to_blocks(x, block_size) for x in (q_BxTxHxK, k_BxTxHxK, v_BxTxHxK))
    qpb, kpb = to_blocks(q_pos_BxT, block_size), to_blocks(k_pos_BxT, block_size)
    cb = context_tiles(context_BxTxC, block_size)
    idx = jnp.arange(block_size)

    def one_query_block(i):
        q, q_pos, q_idx = qb[i], qpb[i], i * block_size + idx

        def tile(carry, step):
            j = nb - 1 - step

            def compute(carry):
                acc, mass, log_after = carry
                k_idx = j * block_size + idx
                context = None if cb is None else (cb[i], cb[j])
                z = tile_logits(q, kb[j], q_pos, kpb[j], scheme, context=context)
                allowed = _allowed(q_idx, k_idx, opts.attend_current) & (k_idx[None, :] < t)
                weights, log_after = stick_weights(z, allowed, log_after)
                acc = acc + jnp.einsum("bhts,bshk->bthk", weights, vb[j].astype(jnp.float32))
                return acc, mass + weights.sum(-1), log_after
            return jax.lax.cond(j <= i, compute, lambda c: c, carry), None

        init = (jnp.zeros((b, block_size, h, d), jnp.float32), jnp.zeros((b, h, block_size), jnp.float32),
                jnp.zeros((b, h, block_size), jnp.float32))
        (acc, mass, _), _ = jax.lax.scan(tile, init, jnp.arange(nb))
        return _finish(acc, mass, vb[i], opts.remainder).astype(v_BxTxHxK.dtype)

    out_NBxBxQxHxK = jax.lax.map(one_query_block, jnp.arange(nb))
    return jnp.moveaxis(out_NBxBxQxHxK, 0, 1).reshape(b, nb * block_size, h, d)[:, :t]
