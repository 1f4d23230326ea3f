"""What every attention path shares: NEG_INF, the logits of one (query block, key block) tile with
every logit hook of the scheme applied, and cutting a sequence into tiles. dense.py re-exports the
first two (where the other paths have always imported them from)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import Scheme

NEG_INF = -1e30  # the logit of a masked (query, key) pair, for every attention path


def tile_logits(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme: Scheme,
                bias: jax.Array | None = None, context: tuple | None = None) -> jax.Array:
    """Logits of one (query block, key block) tile, float32 B x H x T x S: q k^T / sqrt(K), times
    the scheme's `logit_scale`, plus its `bias` (added after the scaling, as ALiBi specifies), or
    plus `bias` when given (a carried bias, computed by the caller), plus its `context_bias` where
    `context` = (the queries' token context, the keys') is given; a scheme that `transforms_logits`
    turns the scaled scores and that total bias into the logits instead (DAPE)."""
    logits_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK,
                                preferred_element_type=jnp.float32) * q_BxTxHxK.shape[-1] ** -0.5
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


def context_tiles(context_BxTxC: jax.Array | None, block: int) -> jax.Array | None:
    """A token context (`Scheme.token_context`) cut into tiles like the positions; None stays None."""
    return None if context_BxTxC is None else to_blocks(context_BxTxC, block)
