"""Attention of a layer while generating: the prompt through the layer's usual path with its cache
filled on the way (`prefill`), then one new token per row against the cache (`decode`).

A decoding step computes what a full forward pass over the same tokens computes at the last
position (tests/models/test_generate.py holds every method and architecture to that): the new
query, rotated at its position, against every cached key at its own position, with every hook of
the scheme (`tile_logits`: its bias, logit scale and transforms; its value term), causal by token
index, within the layer's window where it has one, and LM-Infinite's sink branch (the first keys
seen from the window's distance: models/attention/lambda_mask.py) in the same softmax. O(cached
keys) work per token; nothing of the prompt is recomputed. A scheme that moves positions (Self-Extend,
DCA, ReRoPE, unwrapped) reads its keys' moved rotations from the cache too (`moved_logits`).
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


def keeps_moved_keys(scheme: Scheme) -> bool:
    """Whether a layer's cache keeps its keys as each position move rotates them (LayerCache.moved_k):
    a scheme that moves positions and gives their variants itself (not through a wrapper)."""
    return scheme.traits.moves_positions and not scheme.traits.wrapper


def _scores(q_Bx1xHxK, k_BxGxSxK) -> jax.Array:
    """q k^T / sqrt(K) of one query per row against grouped-query keys read in place, B x H x 1 x S."""
    b, _, heads, k = q_Bx1xHxK.shape
    groups, s = k_BxGxSxK.shape[1], k_BxGxSxK.shape[2]
    q = q_Bx1xHxK.reshape(b, groups, heads // groups, k)
    scores = jnp.einsum("bgrk,bgsk->bgrs", q, k_BxGxSxK, preferred_element_type=jnp.float32) * k ** -0.5
    return scores.reshape(b, heads, 1, s)


def moved_logits(cache: LayerCache, scheme: Scheme, q_Bx1xHxK, k_new_Bx1xGxK, q_pos_Bx1):
    """The cached part's logits for a scheme whose cache keeps moved keys: each pair's score from the
    variant the move rule picks for it (as cpu_flash's kernel does; `Rope.bias` gives the same logits as
    plain + (moved - plain)), then the scheme's other hooks. Returns (logits B x H x 1 x S, the new
    token's moved keys and coordinate for `LayerCache.append`)."""
    variants = scheme.position_variants(q_Bx1xHxK, k_new_Bx1xGxK, q_pos_Bx1, q_pos_Bx1)
    keys = [cache.k[...]] + [moved[...] for moved in cache.moved_k]
    apart_Bx1x1xS = (variants.q_coord[:, :, None] - cache.coord[...][:, None, :])[:, None]
    pick = sum((apart_Bx1x1xS >= t).astype(jnp.int32) for t in variants.thresholds)
    scores = _scores(variants.qs[0], keys[0])
    for r in range(1, len(keys)):
        scores = jnp.where(pick == r, _scores(variants.qs[r], keys[r]), scores)
    k_pos = cache.pos[...]
    no_bias = jnp.zeros((), jnp.float32)  # the moves are in the scores already
    logits = tile_logits(q_Bx1xHxK, jnp.swapaxes(keys[0], 1, 2), q_pos_Bx1, k_pos, scheme, bias=no_bias, scores=scores)
    new_moved = ([k[:, 0] for k in variants.ks[1:]], variants.k_coord[:, 0])
    return logits, new_moved


def _grouped_logits(q_Bx1xHxK, k_BxGxSxK, q_pos_Bx1, k_pos_BxS, scheme: Scheme) -> jax.Array:
    """`tile_logits` of one query per row against the cache's grouped-query keys (B x G x S x K, each
    group's keys contiguous: the products read them in place, no copy per step), B x H x 1 x S: the
    scores of each group of heads against its own key head, except for a scheme whose tile bias reads
    the keys' content (a wrapped ReRoPE, Self-Extend or DCA, ...), which gets them as B x S x H x K,
    repeated."""
    heads = q_Bx1xHxK.shape[2]
    k_BxSxGxK = jnp.swapaxes(k_BxGxSxK, 1, 2)  # for hooks that read keys (computed only where one does)
    if scheme.traits.bias == "tile":
        return tile_logits(q_Bx1xHxK, repeat_heads(k_BxSxGxK, heads), q_pos_Bx1, k_pos_BxS, scheme)
    return tile_logits(q_Bx1xHxK, k_BxSxGxK, q_pos_Bx1, k_pos_BxS, scheme, scores=_scores(q_Bx1xHxK, k_BxGxSxK))


def prefill(cache: LayerCache, scheme: Scheme, q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, positions_BxT) -> None:
    """Fill the cache with a prompt batch's keys (rotated as the layer's path rotates them: the
    scheme's `rotate` over the whole row) and values; the rows' prompt lengths are the cache's
    `length`, set before the call."""
    heads, groups = q_BxTxHxK.shape[2], cache.k.shape[1]  # the cache's heads: every query head's where
    q_rot, k_rot = scheme.rotate(q_BxTxHxK, repeat_heads(k_BxTxGxK, heads), positions_BxT, positions_BxT)  # per head
    k_rot = grouped(k_rot, groups)
    moved = None
    if cache.moved:  # (the queries' variants are not used: XLA drops them)
        variants = scheme.position_variants(q_rot, k_rot, positions_BxT, positions_BxT)
        moved = (variants.ks[1:], variants.k_coord)
    cache.fill(k_rot, repeat_heads(v_BxTxGxK, groups), positions_BxT, repeat_heads(k_BxTxGxK, groups),
               cache.length[...], moved)


def decode(cache: LayerCache, scheme: Scheme, q_Bx1xHxK, k_Bx1xGxK, v_Bx1xGxK, positions_Bx1) -> jax.Array:
    """One new token per row, attended over the cache and itself, then written into the cache. Returns
    B x 1 x H x K. The products read the cache as it came in (the new token's slot is empty there, or
    in a ring holds a token beyond the window) and the new key and value apart, so that the cache is
    updated in place once: read after the update, XLA made a copy of the whole cache for each reader."""
    heads, groups = q_Bx1xHxK.shape[2], cache.k.shape[1]
    q, k_new = scheme.rotate(q_Bx1xHxK, repeat_heads(k_Bx1xGxK, heads), positions_Bx1, positions_Bx1)
    v_new = repeat_heads(v_Bx1xGxK, groups)
    i_B = cache.length[...]  # the new token's index in its row
    k_pos = cache.pos[...]
    new_moved = None
    if cache.moved:
        local, new_moved = moved_logits(cache, scheme, q, grouped(k_new, groups), positions_Bx1)
    else:
        local = _grouped_logits(q, cache.k[...], positions_Bx1, k_pos, scheme)
    logits = [jnp.where(cache.visible(i_B)[:, None, None, :], local, NEG_INF),
              tile_logits(q, k_new, positions_Bx1, positions_Bx1, scheme)]
    values = [(cache.v[...], positions_Bx1, k_pos), (jnp.swapaxes(v_new, 1, 2), positions_Bx1, positions_Bx1)]
    if cache.sinks:  # LM-Infinite's sink keys, seen from the window's distance (lambda_mask.sink_branch)
        n, first = cache.sinks, cache.first[...][:, None]
        sink_q_pos, sink_k_pos = first + cache.mask.limit, jnp.broadcast_to(first, (first.shape[0], n))
        sink_q, sink_k = scheme.rotate(q_Bx1xHxK, repeat_heads(cache.sink_k[...], heads), sink_q_pos, sink_k_pos)
        far = tile_logits(sink_q, sink_k, sink_q_pos, sink_k_pos, scheme)
        far_sinks = i_B[:, None] - jnp.arange(n)[None, :] >= cache.mask.window  # beyond the row's window
        logits.append(jnp.where(far_sinks[:, None, None, :], far, NEG_INF))
        values.append((jnp.swapaxes(cache.sink_v[...], 1, 2), sink_q_pos, sink_k_pos))
    cache.append(grouped(k_new, groups)[:, 0], v_new[:, 0], positions_Bx1[:, 0], repeat_heads(k_Bx1xGxK, groups)[:, 0],
                 new_moved)
    probs = jax.nn.softmax(jnp.concatenate(logits, axis=-1), axis=-1)
    out, start = 0.0, 0
    for (v_BxGxSxK, q_pos, k_pos) in values:
        b, g, s, _ = v_BxGxSxK.shape  # each group of heads / g query heads reads its key / value head
        p = probs[..., start:start + s]
        start += s
        p_grouped = p.reshape(b, g, heads // g, s).astype(v_BxGxSxK.dtype)
        out = out + jnp.einsum("bgrs,bgsk->bgrk", p_grouped, v_BxGxSxK).reshape(b, 1, heads, -1)
        value_term = scheme.value_bias(p, q_pos, k_pos)
        if value_term is not None:
            out = out + value_term.astype(out.dtype)
    return out
