"""Attention of a layer while generating: the prompt through the layer's usual path with its cache
filled on the way (`prefill`), then one new token per row against the cache (`decode`).

A decoding step computes what a full forward pass over the same tokens computes at the last
position (tests/models/test_generate.py holds every method and architecture to that): the new
query, rotated at its position, against every cached key at its own position, with every hook of
the scheme (`tile_logits`: its bias, logit scale and transforms; its value term), causal by token
index, within the layer's window where it has one, and LM-Infinite's sink branch (the first keys
seen from the window's distance: models/attention/lambda_mask.py) in the same softmax. O(cached
keys) work per token; nothing of the prompt is recomputed.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.attention.tiles import NEG_INF, tile_logits
from models.generation.cache import LayerCache
from posenc import Scheme


def repeat_heads(x_BxSxGxK: jax.Array, heads: int) -> jax.Array:
    """Grouped-query keys or values repeated for their query heads (HF's repeat_kv)."""
    groups = x_BxSxGxK.shape[2]
    return x_BxSxGxK if groups == heads else jnp.repeat(x_BxSxGxK, heads // groups, axis=2)


def grouped(x_BxTxHxK: jax.Array, kv_heads: int) -> jax.Array:
    """The first head of each group of a repeated key (the inverse of `repeat_heads`)."""
    heads = x_BxTxHxK.shape[2]
    return x_BxTxHxK if heads == kv_heads else x_BxTxHxK[:, :, ::heads // kv_heads]


def _grouped_logits(q_Bx1xHxK, k_BxSxGxK, q_pos_Bx1, k_pos_BxS, scheme: Scheme) -> jax.Array:
    """`tile_logits` of one query per row against grouped-query keys, B x H x 1 x S: the scores of
    each group of heads against its own key head (no keys repeated), except for a scheme whose tile
    bias reads the keys' content (ReRoPE, Self-Extend, DCA, ...), which gets them repeated."""
    b, _, heads, k = q_Bx1xHxK.shape
    s, groups = k_BxSxGxK.shape[1], k_BxSxGxK.shape[2]
    if groups == heads or scheme.traits.bias == "tile":
        return tile_logits(q_Bx1xHxK, repeat_heads(k_BxSxGxK, heads), q_pos_Bx1, k_pos_BxS, scheme)
    q = q_Bx1xHxK.reshape(b, 1, groups, heads // groups, k)
    scores = jnp.einsum("btgrk,bsgk->bgrts", q, k_BxSxGxK, preferred_element_type=jnp.float32) * k ** -0.5
    return tile_logits(q_Bx1xHxK, k_BxSxGxK, q_pos_Bx1, k_pos_BxS, scheme, scores=scores.reshape(b, heads, 1, s))


def prefill(cache: LayerCache, scheme: Scheme, q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, positions_BxT) -> None:
    """Fill the cache with a prompt batch's keys (rotated as the layer's path rotates them: the
    scheme's `rotate` over the whole row) and values; the rows' prompt lengths are the cache's
    `length`, set before the call."""
    heads, groups = q_BxTxHxK.shape[2], cache.k.shape[2]  # the cache's heads: every query head's where
    _, k_rot = scheme.rotate(q_BxTxHxK, repeat_heads(k_BxTxGxK, heads), positions_BxT, positions_BxT)  # per head
    cache.fill(grouped(k_rot, groups), repeat_heads(v_BxTxGxK, groups), positions_BxT,
               repeat_heads(k_BxTxGxK, groups), cache.length[...])


def decode(cache: LayerCache, scheme: Scheme, q_Bx1xHxK, k_Bx1xGxK, v_Bx1xGxK, positions_Bx1) -> jax.Array:
    """One new token per row: written into the cache, then attended over it. Returns B x 1 x H x K."""
    heads, groups = q_Bx1xHxK.shape[2], cache.k.shape[2]
    q, k_new = scheme.rotate(q_Bx1xHxK, repeat_heads(k_Bx1xGxK, heads), positions_Bx1, positions_Bx1)
    i_B = cache.append(grouped(k_new, groups)[:, 0], repeat_heads(v_Bx1xGxK, groups)[:, 0], positions_Bx1[:, 0],
                       repeat_heads(k_Bx1xGxK, groups)[:, 0])
    k_pos = cache.pos[...]
    local = _grouped_logits(q, cache.k[...], positions_Bx1, k_pos, scheme)
    logits = [jnp.where(cache.visible(i_B)[:, None, None, :], local, NEG_INF)]
    values = [(cache.v[...], positions_Bx1, k_pos)]
    if cache.sinks:  # LM-Infinite's sink keys, seen from the window's distance (lambda_mask.sink_branch)
        n, first = cache.sinks, cache.first[...][:, None]
        sink_q_pos, sink_k_pos = first + cache.mask.limit, jnp.broadcast_to(first, (first.shape[0], n))
        sink_q, sink_k = scheme.rotate(q_Bx1xHxK, repeat_heads(cache.sink_k[...], heads), sink_q_pos, sink_k_pos)
        far = tile_logits(sink_q, sink_k, sink_q_pos, sink_k_pos, scheme)
        far_sinks = i_B[:, None] - jnp.arange(n)[None, :] >= cache.mask.window  # beyond the row's window
        logits.append(jnp.where(far_sinks[:, None, None, :], far, NEG_INF))
        values.append((cache.sink_v[...], sink_q_pos, sink_k_pos))
    probs = jax.nn.softmax(jnp.concatenate(logits, axis=-1), axis=-1)
    out, start = 0.0, 0
    for (v_BxSxGxK, q_pos, k_pos) in values:
        p = probs[..., start:start + v_BxSxGxK.shape[1]]
        start += v_BxSxGxK.shape[1]
        b, s, g, _ = v_BxSxGxK.shape  # each group of heads / g query heads reads its key / value head
        p_grouped = p.reshape(b, g, heads // g, 1, s).astype(v_BxSxGxK.dtype)
        out = out + jnp.einsum("bgrts,bsgk->btgrk", p_grouped, v_BxSxGxK).reshape(b, 1, heads, -1)
        value_term = scheme.value_bias(p, q_pos, k_pos)
        if value_term is not None:
            out = out + value_term.astype(out.dtype)
    return out
