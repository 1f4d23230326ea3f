"""Causal attention over the lower triangle of tiles only, with a hand-written backward pass.

The training-length path (`model.attention=triangular`; what `auto` picks at up to two attention
blocks). Queries are cut into a few static row tiles; tile i attends to keys 0 .. end of tile i, so
the tiles above the diagonal, about half of a dense T x T product, are never computed. Each tile is
one `custom_vjp` softmax-attention whose backward pass uses the identity
    dS = P * (dP - rowsum(dO * O))
(as flash attention does), which saves XLA's generic softmax and mask gradients several passes over
B x H x T x S tensors: that, and the skipped upper tiles, is why a training step's attention runs
faster here than in the dense composite (measured in benchmarks/README.md).

Schemes enter through the same hooks as `dense_attention`: `rotate` once, `bias` and a bias from the
layer's input (`context_bias`, FoX) per row tile (their gradients flow to the scheme's parameters
through the tile's dS), and a per-query `logit_scale`, which is folded into the queries. Schemes with
a `value_bias`, a logit scale that varies along the keys, bias over whole rows (`needs_full_rows`),
a logit transform (DAPE) or weights that are not a softmax (stick-breaking) are not expressible
here; its row in paths.py refuses them.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models.attention.dense import NEG_INF, NO_DROPOUT, Dropout
from posenc import Scheme

TILES = 4                        # row tiles per sequence, within the bounds below
MIN_TILE, MAX_TILE = 64, 128     # measured best on 2 CPU cores for T = 256 .. 1024 (K = 32)


def tile_size(length: int) -> int:
    """Rows per tile: about length / TILES (a multiple of 8) within [MIN_TILE, MAX_TILE]."""
    rows = -(-length // TILES)
    return min(MAX_TILE, max(MIN_TILE, (rows + 7) // 8 * 8))


def triangular_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                         dropout: Dropout = NO_DROPOUT, context_BxTxC: jax.Array | None = None) -> jax.Array:
    """softmax(scale * q k^T / sqrt(K) + bias) v under the causal mask, equal to `dense_attention`
    up to float32 rounding. Logits, softmax and dS are float32; matmul inputs keep q's dtype.
    `context_BxTxC`: the scheme's `token_context` of the layer's input, where it reads one."""
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    b, t, h, d = q_BxTxHxK.shape
    q_BxHxTxK = jnp.swapaxes(q_BxTxHxK, 1, 2) * d ** -0.5
    scale = scheme.logit_scale(q_pos_BxT, k_pos_BxT)
    if scale is not None:  # per query: (q * scale) . k == scale * (q . k)
        q_BxHxTxK = (q_BxHxTxK * scale).astype(q_BxTxHxK.dtype)
    k_BxHxTxK, v_BxHxTxK = jnp.swapaxes(k_BxTxHxK, 1, 2), jnp.swapaxes(v_BxTxHxK, 1, 2)
    step = tile_size(t)
    dropping = dropout.active
    outs = []
    for start in range(0, t, step):
        end = min(start + step, t)
        bias = scheme.bias(q_BxTxHxK[:, start:end], k_BxTxHxK[:, :end], q_pos_BxT[:, start:end],
                           k_pos_BxT[:, :end])
        if context_BxTxC is not None:
            from_input = scheme.context_bias(context_BxTxC[:, start:end], context_BxTxC[:, :end],
                                             q_pos_BxT[:, start:end], k_pos_BxT[:, :end])
            if from_input is not None:
                bias = from_input if bias is None else bias + from_input
        keep = None
        if dropping:
            keep = jax.random.bernoulli(jax.random.fold_in(dropout.key, start), 1.0 - dropout.rate,
                                        (b, h, end - start, end))
        outs.append(_tile_attention(start, dropout.rate if dropping else 0.0, q_BxHxTxK[:, :, start:end],
                                    k_BxHxTxK[:, :, :end], v_BxHxTxK[:, :, :end], bias, keep))
    return jnp.swapaxes(jnp.concatenate(outs, axis=2), 1, 2)


def _causal_mask(start: int, rows: int, cols: int) -> np.ndarray:
    return (start + np.arange(rows))[:, None] >= np.arange(cols)[None, :]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _tile_attention(start, rate, q_BxHxQxK, k_BxHxSxK, v_BxHxSxK, bias, keep_BxHxQxS):
    """Rows start .. start+Q of causal attention against keys 0 .. S (q already scaled)."""
    return _tile_forward(start, rate, q_BxHxQxK, k_BxHxSxK, v_BxHxSxK, bias, keep_BxHxQxS)[0]


def _tile_forward(start, rate, q, k, v, bias, keep):
    s = jnp.einsum("bhqk,bhsk->bhqs", q, k, preferred_element_type=jnp.float32)
    if bias is not None:
        s = s + bias
    s = jnp.where(_causal_mask(start, q.shape[2], k.shape[2]), s, NEG_INF)
    p = jnp.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    p_used = p if keep is None else jnp.where(keep, p / (1.0 - rate), 0.0)
    out = jnp.einsum("bhqs,bhsk->bhqk", p_used.astype(v.dtype), v)
    return out, (q, k, v, bias, keep, p, out)


def _tile_backward(start, rate, residuals, d_out):
    q, k, v, bias, keep, p, out = residuals
    p_used = p if keep is None else jnp.where(keep, p / (1.0 - rate), 0.0)
    d_v = jnp.einsum("bhqs,bhqk->bhsk", p_used.astype(d_out.dtype), d_out)
    d_p = jnp.einsum("bhqk,bhsk->bhqs", d_out, v, preferred_element_type=jnp.float32)
    if keep is not None:
        d_p = jnp.where(keep, d_p / (1.0 - rate), 0.0)
    # sum_s P_s dP_s == dO . O (dropout included), which needs no pass over B x H x Q x S
    row = (d_out.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1, keepdims=True)
    d_s = p * (d_p - row)
    d_q = jnp.einsum("bhqs,bhsk->bhqk", d_s.astype(q.dtype), k).astype(q.dtype)
    d_k = jnp.einsum("bhqs,bhqk->bhsk", d_s.astype(q.dtype), q).astype(k.dtype)
    d_bias = None if bias is None else _sum_to_shape(d_s, jnp.shape(bias)).astype(bias.dtype)
    return d_q, d_k, d_v.astype(v.dtype), d_bias, None


def _sum_to_shape(x: jax.Array, shape: tuple) -> jax.Array:
    """Undo broadcasting: sum `x` over the leading axes `shape` lacks and the axes where it is 1."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


_tile_attention.defvjp(lambda start, rate, *args: _tile_forward(start, rate, *args), _tile_backward)
