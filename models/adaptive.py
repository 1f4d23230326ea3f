"""Adaptive input embeddings and adaptive softmax in Flax NNX.

Baevski & Auli (2019), "Adaptive Input Representations for Neural Language Modeling", and
Grave et al. (2017), "Efficient softmax approximation for GPUs", with the conventions of fairseq's
`transformer_lm_wiki103` (used by Press et al. 2022) so that parameter counts match the papers.

Vocabulary ids are sorted by frequency. Cutoffs (c0, ..., c_{n-1}) split them into bands
[0, c0), [c0, c1), ..., [c_{n-1}, V); band i has width dim_i = d_model // factor**i, so rare words
get small vectors. Band 0 is the softmax "head"; bands 1..n are its tail clusters.

Training (`AdaptiveSoftmax.nll`) scores a tail cluster only for the tokens whose target lies in it
(about a tenth of a word-level corpus's tokens fall in WikiText-103's two tail clusters), with
static shapes: each row of the batch gives each cluster a fixed number of slots, and a batch where
some row needs more falls back to scoring the cluster for every token (`jax.lax.cond`), so the
result is exact either way.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.custom_batching import custom_vmap

from models.partitioning import FSDP, columns_sharded, rows_sharded

_xavier = nnx.initializers.xavier_uniform()

# Slots per row for each tail cluster, as a fraction of the row's length (rounded up to a multiple
# of 8): 128 of 512. Word frequencies follow Zipf's law (exponent ~1.1): over WikiText-103's 267,735
# words it puts ~5% of tokens in [20000, 60000) and ~6% beyond, ~26-31 per row of 512, so a row
# needing more than 128 (a quarter of its words in one cluster) is a list or table of rare names,
# and the fallback that row triggers costs what every batch cost before.
TAIL_CAPACITY = 0.25


def _bands(vocab_size: int, d_model: int, cutoffs: Sequence[int], factor: int) -> list[tuple[int, int, int]]:
    """(start, end, dim) of every band; fails early on cutoffs that would give empty bands."""
    edges = [0, *cutoffs, vocab_size]
    if any(a >= b for a, b in zip(edges, edges[1:])):
        raise ValueError(f"cutoffs {tuple(cutoffs)} must increase strictly inside (0, {vocab_size})")
    bands = [(lo, hi, d_model // factor ** i) for i, (lo, hi) in enumerate(zip(edges, edges[1:]))]
    if bands[-1][2] < 1:
        raise ValueError(f"d_model={d_model} // factor={factor}**{len(cutoffs)} leaves an empty band")
    return bands


class AdaptiveInput(nnx.Module):
    """`emb(tokens_BxT) -> BxTxD`: band i looks up a (band_size_i x dim_i) table, then projects to D.

    As in fairseq every band, the head included, has a bias-free projection dim_i -> d_model
    (for the head a D x D matrix: with the wiki103 setting 1M parameters that a plain embedding
    would not have). Tables start as N(0, dim_i**-0.5), projections as Xavier-uniform.
    """

    def __init__(self, vocab_size: int, d_model: int, cutoffs: Sequence[int] = (), factor: int = 4, *,
                 rngs: nnx.Rngs, dtype=jnp.float32):
        with nnx.use_eager_sharding(False):  # annotations only (experiment/runtime/sharding.py places them)
            self._build(vocab_size, d_model, cutoffs, factor, rngs, dtype)

    def _build(self, vocab_size, d_model, cutoffs, factor, rngs, dtype):
        self.vocab_size, self.d_model, self.cutoffs, self.factor = vocab_size, d_model, tuple(cutoffs), factor
        self.bands = tuple(_bands(vocab_size, d_model, cutoffs, factor))
        self.embeds = nnx.List([
            nnx.Embed(hi - lo, dim, dtype=dtype, rngs=rngs, embedding_init=columns_sharded(
                nnx.initializers.normal(stddev=dim ** -0.5)))
            for lo, hi, dim in self.bands])
        self.projs = nnx.List([
            nnx.Linear(dim, d_model, use_bias=False, kernel_init=columns_sharded(_xavier),
                       dtype=dtype, rngs=rngs)
            for _, _, dim in self.bands])

    @jax.named_scope("adaptive_input")
    def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
        out_BxTxD = None
        for (lo, hi, _), embed, proj in zip(self.bands, self.embeds, self.projs):
            # Every band is evaluated for every token and masked: static shapes, cheap (dim_i x D each).
            local_BxT = jnp.clip(tokens_BxT - lo, 0, hi - lo - 1)
            x_BxTxD = proj(embed(local_BxT))
            in_band_BxTx1 = ((tokens_BxT >= lo) & (tokens_BxT < hi))[..., None]
            x_BxTxD = jnp.where(in_band_BxTx1, x_BxTxD, 0)
            out_BxTxD = x_BxTxD if out_BxTxD is None else out_BxTxD + x_BxTxD
        return out_BxTxD


class AdaptiveSoftmax(nnx.Module):
    """Two-level softmax: p(w) = p(cluster(w) | h) * p(w | cluster, h); head words are their own cluster.

    The head is one bias-free D -> c0 + n linear map, stored in two parts so the word part can be
    tied: `tables[0]` (c0 x D, word logits h @ E_0^T) and `cluster_logits` (D -> n, one logit per
    tail cluster). Tail cluster i (band i >= 1) projects h to dim_i with `tail_projs[i-1]`
    (P_i, dim_i x D, applied as h @ P_i^T) and scores its words with `tables[i]` (E_i,
    band_size_i x dim_i): logits (h @ P_i^T) @ E_i^T. Untied weights start Xavier-uniform.

    With `tie_to=adaptive_input` (fairseq's tie_adaptive_weights + tie_adaptive_proj) the module
    holds the *same* nnx.Param objects as the input and owns only `cluster_logits` (D x n):
      * `tables[i]` is the input's band-i embedding table, for every band, the head included;
      * `tail_projs[i-1]` is the input's band-i projection kernel (dim_i x D), used transposed;
      * the input's band-0 projection (D x D) is *not* used by the softmax, as in fairseq's
        TiedHeadModule: dim_0 == D, so the head table is scored against h directly.
    Count parameters on a module holding both (nnx.state deduplicates shared Params).

    `tail_capacity`: in `nll`, the slots per row (a fraction of its length, rounded up to a multiple
    of 8) in which each tail cluster is scored for the tokens whose target it holds; a batch with a
    row that needs more scores that cluster for every token. 0: every cluster for every token.
    """

    def __init__(self, vocab_size: int, d_model: int, cutoffs: Sequence[int] = (), factor: int = 4, *,
                 rngs: nnx.Rngs, tie_to: AdaptiveInput | None = None, dtype=jnp.float32,
                 tail_capacity: float = TAIL_CAPACITY):
        with nnx.use_eager_sharding(False):  # annotations only (experiment/runtime/sharding.py places them)
            self._build(vocab_size, d_model, cutoffs, factor, rngs, tie_to, dtype)
        self.tail_capacity = float(tail_capacity)

    def _build(self, vocab_size, d_model, cutoffs, factor, rngs, tie_to, dtype):
        self.vocab_size, self.d_model, self.cutoffs, self.factor = vocab_size, d_model, tuple(cutoffs), factor
        self.bands = tuple(_bands(vocab_size, d_model, cutoffs, factor))
        self.dtype = dtype
        n = len(self.cutoffs)
        if tie_to is not None:
            if (tie_to.vocab_size, tie_to.d_model, tie_to.cutoffs, tie_to.factor) != (
                    vocab_size, d_model, self.cutoffs, factor):
                raise ValueError("tie_to must have the same vocab_size, d_model, cutoffs and factor")
            self.tables = nnx.List([e.embedding for e in tie_to.embeds])
            self.tail_projs = nnx.List([p.kernel for p in tie_to.projs[1:]])
        else:
            keys = [rngs.params() for _ in range(2 * n + 1)]
            self.tables = nnx.List([nnx.Param(_xavier(k, (hi - lo, dim)), out_sharding=(None, FSDP))
                                    for k, (lo, hi, dim) in zip(keys, self.bands)])
            self.tail_projs = nnx.List([nnx.Param(_xavier(k, (dim, d_model)), out_sharding=(None, FSDP))
                                        for k, (_, _, dim) in zip(keys[n + 1:], self.bands[1:])])
        self.cluster_logits = (nnx.Linear(d_model, n, use_bias=False, dtype=dtype, rngs=rngs,
                                          kernel_init=rows_sharded(_xavier))
                               if n else None)

    @jax.named_scope("adaptive_softmax_head")
    def _head_log_probs(self, h_BxTxD: jax.Array) -> jax.Array:
        """log p over the c0 head words, then the n clusters: BxTxH with H = c0 + n, float32."""
        h = h_BxTxD.astype(self.dtype)
        logits_BxTxH = h @ self.tables[0][...].astype(self.dtype).T
        if self.cluster_logits is not None:
            logits_BxTxH = jnp.concatenate([logits_BxTxH, self.cluster_logits(h)], axis=-1)
        return jax.nn.log_softmax(logits_BxTxH.astype(jnp.float32), axis=-1)

    def _tail_logits(self, h_BxTxD: jax.Array, i: int) -> jax.Array:
        """Unnormalised scores of the words of band i >= 1 given their cluster, BxTx(band_size_i)."""
        return _tail_logits(h_BxTxD, self.tail_projs[i - 1][...], self.tables[i][...], self.dtype)

    def log_probs(self, h_BxTxD: jax.Array) -> jax.Array:
        """Full-vocabulary log-probabilities, BxTxV float32 (materialises V: evaluation / tests)."""
        head_BxTxH = self._head_log_probs(h_BxTxD)
        c0 = self.bands[0][1]
        parts = [head_BxTxH[..., :c0]]
        for i in range(1, len(self.bands)):
            tail_BxTxS = jax.nn.log_softmax(self._tail_logits(h_BxTxD, i), axis=-1)
            parts.append(head_BxTxH[..., c0 + i - 1, None] + tail_BxTxS)
        return jnp.concatenate(parts, axis=-1)

    def nll(self, h_BxTxD: jax.Array, targets_BxT: jax.Array) -> jax.Array:
        """-log p(target), BxT float32, never building BxTxV (only BxTx(c0 + n), and each tail band
        for the tokens whose target it holds: see `tail_nll`)."""
        head_BxTxH = self._head_log_probs(h_BxTxD)
        c0 = self.bands[0][1]
        with jax.named_scope("adaptive_softmax_head"):
            # Head words index the head directly; a tail word scores its cluster's head entry.
            cluster_BxT = jnp.searchsorted(jnp.asarray(self.cutoffs, jnp.int32), targets_BxT, side="right")
            head_idx_BxT = jnp.where(cluster_BxT == 0, targets_BxT, c0 + cluster_BxT - 1)
            nll_BxT = -jnp.take_along_axis(head_BxTxH, head_idx_BxT[..., None], axis=-1)[..., 0]
        slots = tail_slots(targets_BxT.shape[-1], self.tail_capacity)
        for i, (lo, hi, _) in enumerate(self.bands[1:], start=1):
            nll_BxT = nll_BxT + tail_nll(h_BxTxD, targets_BxT, self.tail_projs[i - 1][...], self.tables[i][...],
                                         lo, hi, slots, self.dtype)
        return nll_BxT


def tail_slots(length: int, capacity: float) -> int:
    """Slots per row for a tail cluster: `capacity` x `length` rounded up to a multiple of 8; 0 (score
    every token) when that leaves no saving."""
    slots = 8 * math.ceil(capacity * length / 8)
    return slots if 0 < slots < length else 0


def _tail_logits(h_BxTxD, proj_dxD, table_Sxd, dtype) -> jax.Array:
    z_BxTxd = h_BxTxD.astype(dtype) @ proj_dxD.astype(dtype).T
    return (z_BxTxd @ table_Sxd.astype(dtype).T).astype(jnp.float32)


def _tail_nll_every_token(h_BxTxD, targets_BxT, proj_dxD, table_Sxd, lo, hi, dtype) -> jax.Array:
    """-log p(target | cluster) where the target lies in [lo, hi), else 0; scores every token."""
    logits_BxTxS = _tail_logits(h_BxTxD, proj_dxD, table_Sxd, dtype)
    local_BxT = jnp.clip(targets_BxT - lo, 0, hi - lo - 1)
    word_BxT = jnp.take_along_axis(logits_BxTxS, local_BxT[..., None], axis=-1)[..., 0]
    in_band_BxT = (targets_BxT >= lo) & (targets_BxT < hi)
    return jnp.where(in_band_BxT, jax.nn.logsumexp(logits_BxTxS, -1) - word_BxT, 0.0)


def _tail_nll_in_slots(h_BxTxD, targets_BxT, proj_dxD, table_Sxd, lo, hi, slots, dtype) -> jax.Array:
    """The same, scoring only the first `slots` tokens of each row whose target lies in [lo, hi)
    (exact when no row has more)."""
    b, t = targets_BxT.shape
    in_band_BxT = (targets_BxT >= lo) & (targets_BxT < hi)
    rank_BxT = jnp.cumsum(in_band_BxT, axis=1, dtype=jnp.int32) - 1  # i-th in-band token of its row
    kept_BxT = in_band_BxT & (rank_BxT < slots)
    rows_Bx1 = jnp.arange(b)[:, None]
    # positions of the kept tokens, slot by slot (unused slots point at position 0 and are masked)
    pos_BxC = jnp.zeros((b, slots), jnp.int32).at[rows_Bx1, jnp.where(kept_BxT, rank_BxT, slots)].set(
        jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), mode="drop")
    used_BxC = jnp.arange(slots) < jnp.sum(kept_BxT, axis=1, keepdims=True)
    h_BxCxD = jnp.take_along_axis(h_BxTxD, pos_BxC[..., None], axis=1)
    targets_BxC = jnp.where(used_BxC, jnp.take_along_axis(targets_BxT, pos_BxC, axis=1), -1)
    nll_BxC = _tail_nll_every_token(h_BxCxD, targets_BxC, proj_dxD, table_Sxd, lo, hi, dtype)
    back_BxT = jnp.take_along_axis(nll_BxC, jnp.clip(rank_BxT, 0, slots - 1), axis=1)
    return jnp.where(kept_BxT, back_BxT, 0.0)


def _tail_nll_by_chunks(h_BxTxD, targets_BxT, proj_dxD, table_Sxd, lo, hi, chunk, dtype) -> jax.Array:
    """`_tail_nll_every_token`, `chunk` positions at a time, each chunk rematerialised in the backward
    pass: the fallback then holds BxCxS logits, as the slot path does, rather than BxTxS (XLA
    reserves memory for either branch of a cond; a differentiated cond also returns the residuals
    of both branches, each filling the other's with zeros)."""
    b, t = targets_BxT.shape
    n = -(-t // chunk)
    h_NxBxCxD = jnp.moveaxis(jnp.pad(h_BxTxD, ((0, 0), (0, n * chunk - t), (0, 0))).reshape(b, n, chunk, -1), 1, 0)
    targets_NxBxC = jnp.moveaxis(jnp.pad(targets_BxT, ((0, 0), (0, n * chunk - t)), constant_values=-1)
                                 .reshape(b, n, chunk), 1, 0)
    one = jax.checkpoint(lambda h, y: _tail_nll_every_token(h, y, proj_dxD, table_Sxd, lo, hi, dtype))
    nll_NxBxC = jax.lax.map(lambda hy: one(*hy), (h_NxBxCxD, targets_NxBxC))
    return jnp.moveaxis(nll_NxBxC, 0, 1).reshape(b, n * chunk)[:, :t]


@jax.named_scope("adaptive_softmax_tail")
def tail_nll(h_BxTxD: jax.Array, targets_BxT: jax.Array, proj_dxD: jax.Array, table_Sxd: jax.Array,
             lo: int, hi: int, slots: int, dtype=jnp.float32) -> jax.Array:
    """-log p(target | its tail cluster [lo, hi)) for the tokens whose target lies in it, else 0,
    BxT float32. With `slots` > 0 each row scores at most that many tokens (BxCxS logits instead
    of BxTxS); when some row of the batch has more, the cluster is scored for every token instead
    (`slots` tokens at a time), so the result and its gradients are those of scoring every token,
    up to float32 rounding."""
    if not slots:
        return _tail_nll_every_token(h_BxTxD, targets_BxT, proj_dxD, table_Sxd, lo, hi, dtype)
    every = lambda *a: _tail_nll_by_chunks(*a, lo, hi, slots, dtype)
    in_slots = lambda *a: _tail_nll_in_slots(*a, lo, hi, slots, dtype)
    count_B = jnp.sum((targets_BxT >= lo) & (targets_BxT < hi), axis=-1, dtype=jnp.int32)
    overflow = _any_exceeds(count_B, jnp.int32(slots))
    return jax.lax.cond(overflow, every, in_slots, h_BxTxD, targets_BxT, proj_dxD, table_Sxd)


@custom_vmap
def _any_exceeds(count_B: jax.Array, slots: jax.Array) -> jax.Array:
    """Whether any row needs more than `slots`. Under `jax.vmap` (training maps rows to draw their
    own dropout) it answers for the whole mapped batch, unbatched, so the `lax.cond` above stays a
    branch instead of becoming a select that computes both sides; both sides agree, so no row's
    value depends on the others."""
    return jnp.any(count_B > slots)


@_any_exceeds.def_vmap
def _any_exceeds_batched(axis_size, in_batched, count_NxB, slots):
    if in_batched[1]:  # per-row capacities: a select computing both branches (still exact)
        return jax.vmap(_any_exceeds.fun, in_axes=(0 if in_batched[0] else None, 0))(count_NxB, slots), True
    return jnp.any(count_NxB > slots), False
