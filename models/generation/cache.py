"""The key / value cache of one attention layer while generating (models/generate.py).

One `LayerCache` per layer, held by its `Attention` (`attn.kv`) on a copy of the model that
generation makes, as `nnx.Cache` variables (so that a compiled step takes them in and gives them back
updated, the parameters untouched). Per row of the batch it keeps, in slots:

  k     the keys as the layer's scheme rotated them when they entered (at their own positions),
        B x G x slots x K: each key-value head's slots contiguous, the layout a decoding step's two
        products read in place;
  v     the values, B x G x slots x K;
  pos   each slot's position (what the scheme's bias, scale and value hooks read);
  idx   each slot's token index in its row (-1: empty), which the causal order and windows use;
  length  how many tokens the row has seen.

A scheme that takes some logits at moved positions (Self-Extend, DCA, ReRoPE: `Rope.position_variants`)
also keeps, per slot, its keys rotated on by each move (`moved_k`, one B x G x slots x K per move; a move's
key shift depends on the key's position alone) and the key's coordinate in the move rule (`coord`): a
decoding step then picks each logit from one of M + 1 products, as the CPU kernel does, instead of
rotating the whole cache again for every new token.

A layer whose attention is windowed (a Lambda mask, models/attention/lambda_mask.py: Mistral's
sliding window, Gemma 3's local layers, LM-Infinite) keeps a ring of `window` slots, token i in slot
i mod window: memory bounded by the window, not the length. LM-Infinite's first `sinks` keys are kept
apart, un-rotated (`sink_k`, `sink_v`, and the row's first position `first`), since its sink branch
rotates them at a position of its own. Any other layer keeps one slot per token (`slots` = the
longest row's prompt plus its new tokens).

Keys are cached as rotated when they enter: for a scheme whose rotation depends only on the key's own
position (every static scaling, Self-Extend, DCA, ReRoPE, which move keys inside their bias hook) this
is what a full forward pass computes. For dynamic NTK, dynamic YaRN and LongRoPE, whose frequencies
follow the row's length, a key keeps the frequencies of the step it entered at (its prompt's length
for the prompt), as transformers' cache keeps them; a new token's query and key use the length so far.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from models.attention.lambda_mask import LambdaMask


@dataclasses.dataclass(frozen=True)
class CacheShape:
    """What a layer's cache holds: rows, slots per row (the ring's size where windowed), key / value
    heads, the features of a rotated key, of an un-rotated key and of a value, and the dtype."""
    batch: int
    slots: int
    kv_heads: int
    key_dim: int
    raw_key_dim: int
    value_dim: int
    dtype: jnp.dtype
    moved: int = 0  # key variants kept for a scheme that moves positions (Self-Extend, DCA, ReRoPE)


class LayerCache(nnx.Module):
    """One layer's cache (the module docstring). `mask`: the layer's Lambda mask (None: causal over
    every key)."""

    def __init__(self, shape: CacheShape, mask: LambdaMask | None):
        b, s, g = shape.batch, shape.slots, shape.kv_heads
        self.mask = mask
        self.ring = mask is not None
        self.k = nnx.Cache(jnp.zeros((b, g, s, shape.key_dim), shape.dtype))
        self.v = nnx.Cache(jnp.zeros((b, g, s, shape.value_dim), shape.dtype))
        self.pos = nnx.Cache(jnp.zeros((b, s), jnp.int32))
        self.idx = nnx.Cache(jnp.full((b, s), -1, jnp.int32))
        self.length = nnx.Cache(jnp.zeros((b,), jnp.int32))
        self.moved = shape.moved
        if self.moved:
            self.moved_k = nnx.List([nnx.Cache(jnp.zeros((b, g, s, shape.key_dim), shape.dtype))
                                     for _ in range(shape.moved)])  # apart: a product read a slice of one stack slower
            self.coord = nnx.Cache(jnp.zeros((b, s), jnp.int32))
        self.sinks = mask.sinks if mask is not None else 0
        if self.sinks:
            self.sink_k = nnx.Cache(jnp.zeros((b, self.sinks, g, shape.raw_key_dim), shape.dtype))
            self.sink_v = nnx.Cache(jnp.zeros((b, self.sinks, g, shape.value_dim), shape.dtype))
            self.first = nnx.Cache(jnp.zeros((b,), jnp.int32))

    @property
    def slots(self) -> int:
        return self.k.shape[2]

    def fill(self, k_BxTxGxK, v_BxTxGxK, positions_BxT, raw_k_BxTxGxK, lengths_B, moved=None) -> None:
        """The cache of a prompt batch (right-padded to T; row b's first `lengths_B[b]` tokens are its
        prompt), written into an empty cache: token i of each row in slot i, or in a ring slot i mod
        window for the row's last `window` tokens; the sink keys apart. `moved`: (the keys of each
        move, B x T x G x K each; their coordinates, B x T) where the cache keeps them."""
        b, t = positions_BxT.shape
        slots = self.slots
        if self.ring:  # slot s holds the row's last token i < length with i mod slots == s
            s = jnp.arange(slots)[None, :]
            last = lengths_B[:, None] - 1
            token = s + slots * jnp.floor_divide(last - s, slots)
            valid = (token >= 0) & (token <= last)
        else:  # (the padding past the longest prompt may not fit: it is never read)
            token = jnp.broadcast_to(jnp.arange(slots)[None, :], (b, slots))
            valid = token < lengths_B[:, None]
        source = jnp.clip(token, 0, t - 1)
        rows = jnp.arange(b)[:, None]
        group_major = lambda x: jnp.swapaxes(jnp.where(valid[..., None, None], x[rows, source], 0), 1, 2)
        self.k[...] = group_major(k_BxTxGxK).astype(self.k.dtype)
        self.v[...] = group_major(v_BxTxGxK).astype(self.v.dtype)
        self.pos[...] = jnp.where(valid, positions_BxT[rows, source], 0)
        self.idx[...] = jnp.where(valid, token, -1)
        self.length[...] = lengths_B.astype(jnp.int32)
        if self.moved:
            moved_k, coord_BxT = moved
            for cached, k in zip(self.moved_k, moved_k):
                cached[...] = group_major(k).astype(cached.dtype)
            self.coord[...] = jnp.where(valid, coord_BxT[rows, source], 0)
        if self.sinks:
            n = min(self.sinks, t)
            self.sink_k[...] = self.sink_k[...].at[:, :n].set(raw_k_BxTxGxK[:, :n].astype(self.sink_k.dtype))
            self.sink_v[...] = self.sink_v[...].at[:, :n].set(v_BxTxGxK[:, :n].astype(self.sink_v.dtype))
            self.first[...] = positions_BxT[:, 0]

    def append(self, k_BxGxK, v_BxGxK, position_B, raw_k_BxGxK, moved=None) -> jax.Array:
        """Write one new token per row (at index `length`, its slot) and count it; returns its index,
        B (the query's index in its row). `moved`: (its keys per move, B x G x K each; its coordinate, B)
        where the cache keeps them."""
        i = self.length[...]
        slot = i % self.slots if self.ring else i
        rows = jnp.arange(i.shape[0])
        self.k[...] = _write_slots(self.k[...], k_BxGxK, slot)
        self.v[...] = _write_slots(self.v[...], v_BxGxK, slot)
        self.pos[...] = self.pos[...].at[rows, slot].set(position_B)
        self.idx[...] = self.idx[...].at[rows, slot].set(i)
        if self.moved:
            moved_k, coord_B = moved
            for cached, k in zip(self.moved_k, moved_k):
                cached[...] = _write_slots(cached[...], k, slot)
            self.coord[...] = self.coord[...].at[rows, slot].set(coord_B)
        if self.sinks:  # a row shorter than its sinks gathers them as they come
            sink = jnp.minimum(i, self.sinks - 1)
            keep = (i < self.sinks)[:, None, None]
            self.sink_k[...] = self.sink_k[...].at[rows, sink].set(
                jnp.where(keep, raw_k_BxGxK, self.sink_k[...][rows, sink]).astype(self.sink_k.dtype))
            self.sink_v[...] = self.sink_v[...].at[rows, sink].set(
                jnp.where(keep, v_BxGxK, self.sink_v[...][rows, sink]).astype(self.sink_v.dtype))
            self.first[...] = jnp.where(i == 0, position_B, self.first[...])
        self.length[...] = i + 1
        return i

    def visible(self, i_B: jax.Array) -> jax.Array:
        """B x slots: the slots query `i_B` (its token index) attends to in the local branch: filled,
        not after it, and within the window where there is one."""
        idx = self.idx[...]
        seen = (idx >= 0) & (idx <= i_B[:, None])
        if self.ring:
            seen &= i_B[:, None] - idx < self.mask.window
        return seen


def _write_slots(cache_BxGxSxK: jax.Array, new_BxGxK: jax.Array, slot_B: jax.Array) -> jax.Array:
    """Row b's new entry in its slot `slot_B[b]`: one dynamic_update_slice per row, which XLA writes in
    place (a scatter at rows and slots, indices on two axes apart, made it copy the whole cache)."""
    for b in range(cache_BxGxSxK.shape[0]):
        entry = new_BxGxK[b][None, :, None, :].astype(cache_BxGxSxK.dtype)
        cache_BxGxSxK = jax.lax.dynamic_update_slice(cache_BxGxSxK, entry, (b, 0, slot_B[b], 0))
    return cache_BxGxSxK
