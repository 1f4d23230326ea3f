"""Attention statistics: per layer and head, how far each query looks back and how spread out its
attention is, by query position. The picture behind a perplexity curve that stays flat or rises.

For query i with causal attention probabilities p_ij (j <= i):

    mean distance  d_i = sum_j p_ij (i - j)          (in tokens: i, j are indices in the window)
    entropy        H_i = -sum_j p_ij log p_ij        (nats; 0 = one key, log(i + 1) = uniform)

The distance counts tokens in the window, not differences of the positions array: for schemes
that run on other positions (randomized, interpolated) it still says how many tokens back a head
reads. The probabilities are the model's own: q and k come from the layer's qkv projection, the
scheme's `rotate` runs once on the whole sequence and each tile's logits come from
`models.attention.dense.tile_logits` (scale, bias), as blockwise attention computes them. A value term
(Shaw's `value_bias`) changes the output, not the probabilities, and is ignored here.

Memory: key tiles of width `block` with an online softmax, as in `blockwise_attention`: per query a
running max m, Z = sum e^(s-m), A = sum e^(s-m) (i-j) and C = sum e^(s-m) (s-m), rescaled when m
grows; then d = A / Z and H = log Z - C / Z. (C is the brief's B = sum e^(s-m) s taken relative to
the running max, C = B - m Z, so that large logits do not cancel in float32.) One
B x H x block x block tile of logits exists at a time; key tiles above the diagonal are skipped.
A scheme with a carried bias (CoPE) sees key tiles right to left with its carry, as in blockwise
attention. A scheme whose bias needs whole rows and cannot carry them (`needs_whole_rows`) is
computed per query tile on whole rows (B x H x block x T): the same O(B H T block) bound.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from models.attention.dense import NEG_INF, tile_logits


def _attends(q_idx, k_idx, window: int):
    """Q x S: causal order and, with a window W > 0, the last W keys (itself included)."""
    causal = q_idx[:, None] >= k_idx[None, :]
    return causal & (q_idx[:, None] - k_idx[None, :] < window) if window else causal


def _update(state, s_BxHxQxS, allowed_QxS, dist_QxS):
    """One tile of the online softmax statistics (m, Z, A, C), each B x H x Q."""
    m, z, a, c = state
    s = jnp.where(allowed_QxS, s_BxHxQxS, NEG_INF)
    m_new = jnp.maximum(m, s.max(-1))
    shifted = jnp.where(allowed_QxS, s - m_new[..., None], 0.0)
    p = jnp.where(allowed_QxS, jnp.exp(shifted), 0.0)
    correction = jnp.exp(m - m_new)
    # C relative to the new max: sum e^(s-m_old) (s - m_new) = C_old + (m_old - m_new) Z_old
    c_new = correction * (c + jnp.where(z > 0, (m - m_new) * z, 0.0)) + (p * shifted).sum(-1)
    return m_new, correction * z + p.sum(-1), correction * a + (p * dist_QxS).sum(-1), c_new


def qk_statistics(q_BxTxHxK: jax.Array, k_BxTxHxK: jax.Array, q_pos_BxT: jax.Array, k_pos_BxT: jax.Array,
                  scheme, block: int = 512, context_BxTxC: jax.Array | None = None,
                  window: int = 0) -> tuple[jax.Array, jax.Array]:
    """(mean distance, entropy), each float32 B x H x T, of causal self-attention between queries
    and keys of one sequence (before the scheme's `rotate`, which runs here), tile by tile;
    `context_BxTxC`: the scheme's `token_context` of the layer's input, where it reads one; with a
    `window` W > 0 (a sliding window, Mistral's), over the last W keys only. The statistics are
    those of a softmax: a stick-breaking scheme is refused."""
    if scheme.traits.normalization != "softmax":
        raise ValueError(f"positional scheme {scheme.name!r} is not a softmax (stick-breaking); attention "
                         f"statistics are computed for softmax attention only")
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    b, t, h, _ = q_BxTxHxK.shape
    block = max(1, min(block, t))
    nb = -(-t // block)
    pad = nb * block - t
    whole_rows = scheme.traits.needs_whole_rows
    carried = scheme.traits.needs_full_rows and not whole_rows  # and so `carries_bias`

    def blocks(x, fill=0):  # B x T x ... -> NB x B x block x ...
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        return jnp.moveaxis(x.reshape(b, nb, block, *x.shape[2:]), 1, 0)

    qb, qpb = blocks(q_BxTxHxK), blocks(q_pos_BxT)
    cb = None if context_BxTxC is None else blocks(context_BxTxC)
    # padded keys get a position after every query, so that a carried bias (gates) ignores them
    kb, kpb = blocks(k_BxTxHxK), blocks(k_pos_BxT, fill=jnp.iinfo(jnp.int32).max if carried else 0)
    idx = jnp.arange(block)
    init = (jnp.full((b, h, block), NEG_INF, jnp.float32),) + tuple(
        jnp.zeros((b, h, block), jnp.float32) for _ in range(3))

    def finish(state):
        _, z, a, c = state
        return a / z, jnp.log(z) - c / z

    def one_query_block(i):
        q, q_pos, q_idx = qb[i], qpb[i], i * block + idx

        if whole_rows:  # the bias needs every key of a row: B x H x block x T at once
            k_idx = jnp.arange(t)
            s = tile_logits(q, k_BxTxHxK, q_pos, k_pos_BxT, scheme,
                            context=None if cb is None else (cb[i], context_BxTxC))
            allowed = _attends(q_idx, k_idx, window)
            return finish(_update(init, s, allowed, (q_idx[:, None] - k_idx[None, :]).astype(jnp.float32)))

        def tile(carry, step):
            j = nb - 1 - step if carried else step  # carried biases see key tiles right to left

            def compute(carry):
                state, row_BxHxQ = carry
                k, k_pos, k_idx = kb[j], kpb[j], j * block + idx
                bias = None
                if carried:
                    bias, row_BxHxQ = scheme.carried_bias(q, k, q_pos, k_pos, row_BxHxQ)
                s = tile_logits(q, k, q_pos, k_pos, scheme, bias, None if cb is None else (cb[i], cb[j]))
                allowed = _attends(q_idx, k_idx, window) & (k_idx[None, :] < t)
                dist = (q_idx[:, None] - k_idx[None, :]).astype(jnp.float32)
                return _update(state, s, allowed, dist), row_BxHxQ
            return jax.lax.cond(j <= i, compute, lambda c: c, carry), None

        (state, _), _ = jax.lax.scan(tile, (init, jnp.zeros((b, h, block), jnp.float32)), jnp.arange(nb))
        return finish(state)

    dist_NBxBxHxQ, ent_NBxBxHxQ = jax.lax.map(one_query_block, jnp.arange(nb))

    def unblock(x):  # NB x B x H x block -> B x H x T
        return jnp.moveaxis(x, 0, 2).reshape(b, h, nb * block)[:, :, :t]
    return unblock(dist_NBxBxHxQ), unblock(ent_NBxBxHxQ)


def layer_statistics(attn_module, x_BxTxD: jax.Array, positions_BxT: jax.Array,
                     block: int = 512) -> tuple[jax.Array, jax.Array]:
    """(mean distance, entropy), each float32 B x H x T, of one decoder layer's `Attention` given
    its input (after ln1): q and k from the module's own qkv projection, as `Attention.__call__`
    computes them, its scheme and the scheme's `token_context` of the input. A sliding window
    (`model.attention_window` without sinks, Mistral's) applies; LM-Infinite's sink branch does
    not, so a layer with `attention_sinks` is refused."""
    if attn_module.cfg.attention_sinks:
        raise ValueError("attention statistics do not apply LM-Infinite's sink keys (model.attention_sinks); "
                         "evaluate them with --set model.attention_sinks=0")
    q, k, _ = attn_module.project(x_BxTxD)
    context = attn_module.scheme.token_context(x_BxTxD, positions_BxT)
    return qk_statistics(q, k, positions_BxT, positions_BxT, attn_module.scheme, block, context,
                         attn_module.cfg.attention_window)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _layer_step(graphdef, state, x_BxTxD, positions_BxT, block, weights_B):
    """One decoder block: its statistics (weighted mean over the batch, H x T) and its output."""
    blk = nnx.merge(graphdef, state)
    dist, ent = layer_statistics(blk.attn, blk.ln1(x_BxTxD), positions_BxT, block)
    w = weights_B / weights_B.sum()
    return blk(x_BxTxD, positions_BxT), jnp.einsum("b,bht->ht", w, dist), jnp.einsum("b,bht->ht", w, ent)


@functools.partial(jax.jit, static_argnums=0)
def _embed_step(graphdef, state, tokens_BxT, positions_BxT):
    model = nnx.merge(graphdef, state)
    return model.scheme.embed(model.embed_tokens(tokens_BxT), positions_BxT)


def attention_statistics(model, tokens_BxT: jax.Array, positions_BxT: jax.Array | None = None,
                         block: int = 512, *, weights_B: jax.Array | None = None) -> dict[str, jax.Array]:
    """{"mean_distance": L x H x T, "entropy": L x H x T} (float32), averaged over the batch
    (weighted by `weights_B` where given: padding rows 0), for `model` (a DecoderLM) on `tokens_BxT`.

    The forward pass is the decoder's evaluation pass (no dropout): `embed_tokens`,
    `scheme.embed`, then each Block called as the decoder calls it, so the residual stream is the
    model's own; each layer's statistics come from its Attention on ln1 of that stream. Positions
    default to 0 .. T-1 (after the scheme's length check), as in `DecoderLM.hidden`. Each block is
    one jitted program, compiled once for all layers of the same structure; the function may also
    be traced inside an outer jit."""
    b, t = tokens_BxT.shape
    if positions_BxT is None:
        model.scheme.check_length(t)
        positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    weights_B = jnp.ones((b,), jnp.float32) if weights_B is None else jnp.asarray(weights_B, jnp.float32)
    x = _embed_step(*nnx.split(model), tokens_BxT, positions_BxT)
    dists, ents = [], []
    for blk in model.blocks:
        graphdef, state = nnx.split(blk)
        x, dist, ent = _layer_step(graphdef, state, x, positions_BxT, int(block), weights_B)
        dists.append(dist)
        ents.append(ent)
    return {"mean_distance": jnp.stack(dists), "entropy": jnp.stack(ents)}
