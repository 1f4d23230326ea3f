"""LM-Infinite's Lambda-shaped attention (Han et al., NAACL 2024; attention sinks, Xiao et al., ICLR
2024): a training-free evaluation option for any scheme (`model.attention_sinks`,
`model.attention_window`, switchable with `eval_extrapolate.py --set`).

Query i sees
  - the keys of its local window, i - j < W (itself included), at their own positions, and
  - the first `sinks` tokens (j < n_global) where they lie beyond the window, seen as if from
    distance W, the window: the scheme's hooks get the sink keys at the row's first position p0 and
    the query at p0 + W, so a rotation, a bias or a logit scale never meets a distance beyond the
    window (the authors' code: keys unrotated, queries rotated by `limit_distance`, which their
    `convert_llama_model` sets to the local branch W). `model.attention_sink_distance` sets another
    distance (their `limit_distance` apart from the window): L gives this project's form before
    issue 34, which saw the sinks from L whatever the window (the same where W = L, the default).
Both branches share one softmax. W defaults to L; with `sinks` 0 it is a plain sliding window.
Within W (every query at lengths <= W) the mask is the causal one. A scheme's `embed` is
unchanged: absolute positions are baked into the input, the mask alone applies to them. A data
dependent bias (FoX's forget gates) is the tokens' own, not a distance, and is not capped.

Dense attention computes both branches over whole rows; blockwise attention visits only the key
tiles that meet each query tile's window (tiles the mask empties are never computed) and one
extra tile of the sink keys, so it costs O(T x (W + sinks)), not O(T^2). Schemes whose bias needs
whole rows (CoPE) or that are not a softmax (stick-breaking) are refused; so are the triangular,
fused and Pallas paths (their rows in models/attention/paths.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from models.attention.tiles import NEG_INF, tile_logits
from posenc import Scheme


@dataclasses.dataclass(frozen=True)
class LambdaMask:
    """The mask's sizes: `sinks` first tokens, a local `window` (a query and its window - 1
    predecessors), the distance `limit` the sinks are seen at from beyond the window."""
    sinks: int
    window: int
    limit: int

    def local(self, q_idx: jax.Array, k_idx: jax.Array) -> jax.Array:
        """Q x S: key j is in query i's window (token indices, not positions)."""
        distance = q_idx[:, None] - k_idx[None, :]
        return (distance >= 0) & (distance < self.window)

    def far_sinks(self, q_idx: jax.Array, num_sinks: int) -> jax.Array:
        """Q x num_sinks: sink key j lies beyond query i's window (where the sink branch applies)."""
        return q_idx[:, None] - jnp.arange(num_sinks)[None, :] >= self.window

    def window_tiles(self, block: int) -> int:
        """Key tiles of width `block` a query tile's windows can reach, its own included."""
        return -(-(self.window - 1) // block) + 1


def lambda_mask(model_cfg: Any, train_length: int) -> LambdaMask | None:
    """The mask a model config asks for (None: plain causal attention): `attention_sinks` first
    tokens and a window of `attention_window` (0: the training length), both options 0: off; the
    sinks seen from `attention_sink_distance` (0: the window, as the authors' convert_llama_model)."""
    sinks, window = int(model_cfg.attention_sinks), int(model_cfg.attention_window)
    if sinks == 0 and window == 0:
        return None
    window = window or train_length
    return LambdaMask(sinks=sinks, window=window, limit=int(getattr(model_cfg, "attention_sink_distance", 0)) or window)


@dataclasses.dataclass(frozen=True)
class SinkBranch:
    """The first keys as the sink branch sees them: q rotated as if at p0 + limit (B x T x H x K), the sink
    keys as if at p0 (B x n x H x K), their values, those positions, the sink keys' token context."""
    q: jax.Array
    k: jax.Array
    v: jax.Array
    q_pos: jax.Array
    k_pos: jax.Array
    k_context: jax.Array | None


def sink_branch(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme, mask: LambdaMask,
                context_BxTxC=None) -> SinkBranch:
    """The sink branch of un-rotated q and k: one more `rotate` of the queries (at a position that
    does not change along the row), and of the first min(sinks, T) keys."""
    b, t = q_pos_BxT.shape
    n = max(1, min(mask.sinks, t))  # one (masked) key where there are no sinks keeps shapes simple
    first = k_pos_BxT[:, :1]
    q_pos = jnp.broadcast_to(first + mask.limit, (b, t)).astype(q_pos_BxT.dtype)
    k_pos = jnp.broadcast_to(first, (b, n)).astype(k_pos_BxT.dtype)
    q, k = scheme.rotate(q_BxTxHxK, k_BxTxHxK[:, :n], q_pos, k_pos)
    k_context = None if context_BxTxC is None else context_BxTxC[:, :n]
    return SinkBranch(q, k, v_BxTxHxK[:, :n], q_pos, k_pos, k_context)


def sink_logits(branch: SinkBranch, scheme: Scheme, mask: LambdaMask, q_BxQxHxK, q_pos_BxQ, q_idx_Q,
                q_context_BxQxC=None) -> jax.Array:
    """The sink branch's logits for queries `q_idx_Q` (rows of `branch.q`), masked: B x H x Q x n."""
    n = branch.k.shape[1]
    context = None if q_context_BxQxC is None else (q_context_BxQxC, branch.k_context)
    s = tile_logits(q_BxQxHxK, branch.k, q_pos_BxQ, branch.k_pos, scheme, context=context)
    allowed = mask.far_sinks(q_idx_Q, n) & (jnp.arange(n) < mask.sinks)[None, :]
    return jnp.where(allowed, s, NEG_INF)


def lambda_dense_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                           mask: LambdaMask, context_BxTxC=None) -> jax.Array:
    """Causal self-attention under the Lambda mask over whole rows: the local branch (T x T, masked to
    the window) and the sink branch (T x n) in one softmax."""
    branch = sink_branch(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme, mask, context_BxTxC)
    q, k = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    t = q.shape[1]
    idx = jnp.arange(t)
    context = None if context_BxTxC is None else (context_BxTxC, context_BxTxC)
    local = jnp.where(mask.local(idx, idx), tile_logits(q, k, q_pos_BxT, k_pos_BxT, scheme, context=context), NEG_INF)
    far = sink_logits(branch, scheme, mask, branch.q, branch.q_pos, idx, context_BxTxC)
    probs = jax.nn.softmax(jnp.concatenate([local, far], axis=-1), axis=-1)
    p_local, p_far = probs[..., :t], probs[..., t:]
    out = (jnp.einsum("bhts,bshk->bthk", p_local.astype(v_BxTxHxK.dtype), v_BxTxHxK)
           + jnp.einsum("bhts,bshk->bthk", p_far.astype(v_BxTxHxK.dtype), branch.v))
    for p, q_pos, k_pos in ((p_local, q_pos_BxT, k_pos_BxT), (p_far, branch.q_pos, branch.k_pos)):
        value_term = scheme.value_bias(p, q_pos, k_pos)
        if value_term is not None:
            out = out + value_term.astype(out.dtype)
    return out
