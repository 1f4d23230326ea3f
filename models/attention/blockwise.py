"""Blockwise attention: causal self-attention tile by tile with an online softmax, O(T * block)
memory, for long evaluation (what `auto` picks beyond two attention blocks, see choice.py)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models.attention.call import Call
from models.attention.lambda_mask import LambdaMask, sink_branch, sink_logits
from models.attention.stickbreaking import stickbreaking_blockwise
from models.attention.tiles import NEG_INF, context_tiles, map_after, tile_logits, to_blocks
from posenc import Scheme


def _softmax_update(state, s_BxHxQxS, v_BxHxSxK, value_term):
    """One tile of the online softmax: (m, l, acc, row) with the tile's masked logits and values
    added; `value_term(p)` is the scheme's value term of the tile's unnormalised probabilities
    (B x Q x H x K, as `value_bias` returns it). The accumulator is B x H x Q x K, the layout of
    the tile's product, so that no tile is transposed."""
    m_BxHxQ, l_BxHxQ, acc_BxHxQxK, row_BxHxQ = state
    m_new = jnp.maximum(m_BxHxQ, s_BxHxQxS.max(-1))
    p = jnp.exp(s_BxHxQxS - m_new[..., None])
    correction = jnp.exp(m_BxHxQ - m_new)
    l_new = l_BxHxQ * correction + p.sum(-1)
    out = jnp.einsum("bhts,bhsk->bhtk", p.astype(v_BxHxSxK.dtype), v_BxHxSxK).astype(jnp.float32)
    extra = value_term(p)
    if extra is not None:
        out = out + jnp.swapaxes(extra, 1, 2).astype(jnp.float32)
    acc = acc_BxHxQxK * correction[..., None] + out
    return m_new, l_new, acc, row_BxHxQ


def blockwise_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                        block_size: int = 512, *, context_BxTxC: jax.Array | None = None) -> jax.Array:
    """`blockwise_call` of a causal call at these positions, tiles of `block_size` (and the scheme's token
    context): what the paths' callers without a `Call` use."""
    call = Call(q_pos_BxT, k_pos_BxT, scheme, context=context_BxTxC, block=block_size)
    return blockwise_call(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, call)


def blockwise_call(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, call: Call) -> jax.Array:
    """Causal self-attention in (query block, key block) tiles of `call.block` positions with an
    online softmax (no attention dropout: its row in paths.py refuses it).

    Memory is O(T * block) instead of O(T^2): only one B x H x block x block tile of logits exists
    at a time. Key blocks after the query block's diagonal are skipped and only the diagonal block
    is masked (`lax.switch`, which keeps the function differentiable); the accumulator and the
    values are kept in the layout of the tile products (B x H x block x K), so that no tile is
    transposed. `rotate` runs once on the whole sequence (it is per position); `bias`,
    `logit_scale` and `value_bias` run per tile. `value_bias` must be linear in the probabilities
    (true of Shaw et al.'s value term): it is accumulated with the same rescaling as the output.
    A scheme whose bias needs whole rows (`needs_full_rows`, e.g. CoPE) provides instead
    `carried_bias(q, k, q_pos, k_pos, carry_BxHxQ) -> (bias, carry)`: key tiles are then visited
    from the diagonal down to the first (the online softmax does not mind the order), with a
    per-query carry that starts at zero. A scheme that reads the layer's input gets its
    `token_context` (`context_BxTxC`, computed once over the whole sequence) cut into the same
    tiles. Under LM-Infinite's Lambda mask (`call.mask`, lambda_mask.py) only the key tiles that meet each
    query tile's window are visited, then one tile of the sink keys. A stick-breaking scheme runs
    its own recurrence (stickbreaking.py). Numerically equal to `dense_attention` up to float32
    rounding. What it refuses (a whole-row bias it cannot carry; under the mask, schemes without
    a window to cut) is its row in paths.py.
    """
    q_pos_BxT, k_pos_BxT, scheme, block_size = call.q_pos, call.k_pos, call.scheme, call.block
    context_BxTxC, mask = call.context, call.mask
    if scheme.traits.normalization == "stickbreaking":
        return stickbreaking_blockwise(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme, block_size,
                                       context_BxTxC)
    sinks = None
    if mask is not None and mask.sinks:
        sinks = sink_branch(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme, mask, context_BxTxC)
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    tiles = _Tiles.cut(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, call)
    sink_tiles = None if sinks is None else (sinks, to_blocks(sinks.q, block_size), to_blocks(sinks.q_pos, block_size),
                                             jnp.swapaxes(sinks.v, 1, 2))
    out_NBxBxHxQxK = map_after(lambda i: _query_block(tiles, i, sink_tiles), jnp.arange(tiles.nb), tiles.q)
    b, t, h, _ = q_BxTxHxK.shape
    out_BxNBxQxHxK = jnp.transpose(out_NBxBxHxQxK, (1, 0, 3, 2, 4))
    return out_BxNBxQxHxK.reshape(b, tiles.nb * block_size, h, -1)[:, :t].astype(v_BxTxHxK.dtype)


@dataclasses.dataclass(frozen=True)
class _Tiles:
    """One sequence cut into tiles of `block` positions (NB x B x block x ..., values NB x B x H x
    block x K: the products' layout), with what every tile's logits need."""
    q: jax.Array
    k: jax.Array
    v: jax.Array
    q_pos: jax.Array
    k_pos: jax.Array
    context: jax.Array | None
    scheme: Scheme
    mask: LambdaMask | None
    length: int
    block: int

    @property
    def nb(self) -> int:
        return self.q.shape[0]

    @property
    def carried(self) -> bool:
        return self.scheme.traits.needs_full_rows  # and so `carries_bias`

    @staticmethod
    def cut(q, k, v, call: Call) -> "_Tiles":
        """q, k (rotated) and v of `call` in its tiles."""
        # padded keys get a position after every query, so that a carried bias (gates) ignores them
        fill = jnp.iinfo(jnp.int32).max if call.scheme.traits.needs_full_rows else 0
        block = call.block
        return _Tiles(to_blocks(q, block), to_blocks(k, block), jnp.swapaxes(to_blocks(v, block), 2, 3),
                      to_blocks(call.q_pos, block), to_blocks(call.k_pos, block, fill=fill),
                      context_tiles(call.context, block), call.scheme, call.mask, q.shape[1], block)

    def visit(self, i, j, carry, masked: bool):
        """The online softmax's state after key tile j of query tile i; `masked`: the causal mask (and
        the Lambda mask's window) applied, else every logit kept (a tile below the diagonal)."""
        q, q_pos, k, v, k_pos = self.q[i], self.q_pos[i], self.k[j], self.v[j], self.k_pos[j]
        row_BxHxQ, bias = carry[3], None
        if self.carried:
            bias, row_BxHxQ = self.scheme.carried_bias(q, k, q_pos, k_pos, row_BxHxQ)
        context = None if self.context is None else (self.context[i], self.context[j])
        s = tile_logits(q, k, q_pos, k_pos, self.scheme, bias, context)
        if masked:
            q_idx, k_idx = i * self.block + jnp.arange(self.block), j * self.block + jnp.arange(self.block)
            allowed = (q_idx[:, None] >= k_idx[None, :]) & (k_idx[None, :] < self.length)
            if self.mask is not None:
                allowed = allowed & self.mask.local(q_idx, k_idx)
            s = jnp.where(allowed, s, NEG_INF)
        return _softmax_update((*carry[:3], row_BxHxQ), s, v, lambda p: self.scheme.value_bias(p, q_pos, k_pos))


def _query_block(tiles: _Tiles, i, sink_tiles) -> jax.Array:
    """Query tile i's output, B x H x block x K: its key tiles visited in a scan (a carried bias right
    to left; under a Lambda mask only the window's tiles, i - steps + 1 .. i), then the sink keys
    (`sink_tiles`: the sink branch, its queries and their positions in tiles, its values B x H x n x K)."""
    mask, nb = tiles.mask, tiles.nb
    steps = nb if mask is None else min(nb, mask.window_tiles(tiles.block))

    def step(carry, n):
        if mask is not None:
            j = i - steps + 1 + n
            return jax.lax.cond(j >= 0, lambda c: tiles.visit(i, j, c, True), lambda c: c, carry), None
        j = nb - 1 - n if tiles.carried else n
        # causal: a tile above the diagonal is skipped, one below it needs no mask (its keys all precede
        # its queries, none is padding), the diagonal tile is masked
        kind = jnp.where(j > i, 0, jnp.where(j < i, 1, 2))
        branches = [lambda c: c, lambda c: tiles.visit(i, j, c, False), lambda c: tiles.visit(i, j, c, True)]
        return jax.lax.switch(kind, branches, carry), None

    b, h, d = tiles.q.shape[1], tiles.q.shape[3], tiles.v.shape[-1]
    zeros = jnp.zeros((b, h, tiles.block), jnp.float32)
    init = (jnp.full((b, h, tiles.block), NEG_INF, jnp.float32), zeros, jnp.zeros((b, h, tiles.block, d), jnp.float32),
            zeros)
    state, _ = jax.lax.scan(step, init, jnp.arange(steps))
    if sink_tiles is not None:  # last, once the running maximum is a real logit
        sinks, sink_q, sink_q_pos, sink_v = sink_tiles
        sq, sqp = sink_q[i], sink_q_pos[i]
        q_idx = i * tiles.block + jnp.arange(tiles.block)
        s = sink_logits(sinks, tiles.scheme, mask, sq, sqp, q_idx, None if tiles.context is None else tiles.context[i])
        state = _softmax_update(state, s, sink_v, lambda p: tiles.scheme.value_bias(p, sqp, sinks.k_pos))
    m, l, acc, _ = state
    return acc / l[..., None]
