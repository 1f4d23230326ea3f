"""What every attention path shares: NEG_INF, the logits of one (query block, key block) tile with
every logit hook of the scheme applied, cutting a sequence into tiles, and a map over tiles whose
output XLA cannot allocate before its input exists (`map_after`). dense.py re-exports the
first two (where the other paths have always imported them from)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import Scheme

NEG_INF = -1e30  # the logit of a masked (query, key) pair, for every attention path


def tile_logits(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme: Scheme,
                bias: jax.Array | None = None, context: tuple | None = None,
                scores: jax.Array | None = None) -> jax.Array:
    """Logits of one (query block, key block) tile, float32 B x H x T x S: q k^T / sqrt(K), times
    the scheme's `logit_scale`, plus its `bias` (added after the scaling, as ALiBi specifies), or
    plus `bias` when given (a carried bias, computed by the caller), plus its `context_bias` where
    `context` = (the queries' token context, the keys') is given; a scheme that `transforms_logits`
    turns the scaled scores and that total bias into the logits instead (DAPE). `scores`: q k^T /
    sqrt(K) where the caller computed it (grouped-query keys, models/generation/attend.py)."""
    logits_BxHxTxS = scores if scores is not None else jnp.einsum(
        "bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK, preferred_element_type=jnp.float32) * q_BxTxHxK.shape[-1] ** -0.5
    scale = scheme.logit_scale(q_pos_BxT, k_pos_BxS)
    if scale is not None:
        logits_BxHxTxS = logits_BxHxTxS * scale
    if bias is None:
        bias = scheme.bias(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
    if context is not None:
        from_input = scheme.context_bias(context[0], context[1], q_pos_BxT, k_pos_BxS)
        if from_input is not None:
            bias = from_input if bias is None else bias + from_input
    if scheme.traits.transforms_logits:
        return scheme.transform_logits(logits_BxHxTxS, bias, q_pos_BxT, k_pos_BxS)
    if bias is not None:
        logits_BxHxTxS = logits_BxHxTxS + bias
    return logits_BxHxTxS


def to_blocks(x_BxTx: jax.Array, block: int, fill=0) -> jax.Array:
    """B x T x ... -> NB x B x block x ...: the sequence cut into tiles of `block` positions, the
    last one padded with `fill`."""
    b, t = x_BxTx.shape[:2]
    nb = -(-t // block)
    x = jnp.pad(x_BxTx, [(0, 0), (0, nb * block - t)] + [(0, 0)] * (x_BxTx.ndim - 2), constant_values=fill)
    return jnp.moveaxis(x.reshape(b, nb, block, *x.shape[2:]), 1, 0)


def map_after(fn, xs, anchor):
    """`jax.lax.map(fn, xs)` (over the leading axis of every leaf of `xs`), whose output buffer XLA can
    make only once `anchor` (an array, or a tree whose first leaf is one) exists.

    lax.map fills a zero-initialised buffer that depends on nothing, and XLA:CPU's concurrency-
    optimised scheduler creates those of every layer at the start of a program: a 30-layer model's
    long forward pass held 60 such buffers at once (SmolLM2-135M at 8,192 tokens: 1.24 GB of
    temporaries; 0.12 GB with this, benchmarks/README.md). Here the buffer is zeros plus a zero
    computed from `anchor` (x * 0, which XLA does not fold for floats), filled slot by slot in a
    `fori_loop`; differentiable like lax.map (the buffer enters the backward pass only through
    linear slot updates, so nothing per step is kept for it). An optimization barrier did not do
    it: XLA:CPU expands barriers before scheduling."""
    n = jax.tree.leaves(xs)[0].shape[0]
    one = jax.eval_shape(fn, jax.tree.map(lambda x: x[0], xs))
    zero = jax.tree.leaves(anchor)[0].ravel()[0] * 0  # a zero XLA must compute from `anchor` (x * 0 is not folded)
    out = jax.tree.map(lambda s: jnp.zeros((n, *s.shape), s.dtype) + zero.astype(s.dtype), one)

    def step(i, out):
        result = fn(jax.tree.map(lambda x: x[i], xs))
        return jax.tree.map(lambda buffer, r: buffer.at[i].set(r), out, result)
    return jax.lax.fori_loop(0, n, step, out)


def context_tiles(context_BxTxC: jax.Array | None, block: int) -> jax.Array | None:
    """A token context (`Scheme.token_context`) cut into tiles like the positions; None stays None."""
    return None if context_BxTxC is None else to_blocks(context_BxTxC, block)
