"""Contextual Position Encoding (CoPE): positions that count gated keys instead of tokens."""
from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.options.content import CopeOptions
from posenc.registry import register
from posenc.traits import Traits


def contextual_positions(gates_BxHxTxS: jax.Array) -> jax.Array:
    """p_ij = sum_{t=j}^{S-1} g_it: a reverse cumulative sum over keys (masked gates are 0, so for a
    causal row this is sum_{t=j}^{i} g_it)."""
    return jnp.flip(jnp.cumsum(jnp.flip(gates_BxHxTxS, -1), axis=-1), -1)


def interpolate_logits(z_BxHxTxP: jax.Array, p_BxHxTxS: jax.Array) -> jax.Array:
    """z[p] for fractional p in [0, P-1]: (1 - w) z[floor p] + w z[floor p + 1], w = p - floor p,
    gathered per (query, key) from the B x H x T x P table of per-integer-position logits."""
    num = z_BxHxTxP.shape[-1]
    lo = jnp.clip(jnp.floor(p_BxHxTxS), 0, num - 1)
    w = p_BxHxTxS - lo
    lo_i = lo.astype(jnp.int32)
    hi_i = jnp.minimum(lo_i + 1, num - 1)
    # indices in range by construction: "clip" spares the gradient's scatter the masking of "fill"
    # (measured: forward + backward of both lookups 115 -> 80 ms at 8 x 8 heads x 256 x 256, 2 CPU cores)
    z_lo = jnp.take_along_axis(z_BxHxTxP, lo_i, axis=-1, mode="clip")
    z_hi = jnp.take_along_axis(z_BxHxTxP, hi_i, axis=-1, mode="clip")
    return (1.0 - w) * z_lo + w * z_hi


@register("cope")
class Cope(Scheme):
    """Contextual Position Encoding: the position of key j seen from query i counts the keys
    between them that the query's gates let through.

        g_ij = sigmoid(q_i . k_j / sqrt(d)),   p_ij = sum_{t=j}^{i} g_it,
        bias_ij = q_i . e[p_ij] = (1 - w) q_i . e[floor p_ij] + w q_i . e[floor p_ij + 1], w = p - floor p,

    with e a learned P x d table (shared by the heads, one per layer) and p_ij clamped to P - 1.
    q_i . e[p] is computed for every integer p (B x H x T x P) and gathered: no T x T x d tensor.
    Golovneva, Wang, Weston & Sukhbaatar, "Contextual Position Encoding: Learning to Count What's
    Important", 2024. The gate logit takes the same 1/sqrt(d) as the attention logit (the
    authors' code gates the scaled logits); e starts as N(0, 0.02^2) (our choice).

    p_ij sums over all keys j .. i, which one key tile does not hold: the scheme sets
    `needs_full_rows` and provides `carried_bias`, which blockwise attention calls on key tiles
    from right to left, carrying each query's sum of the gates already seen (the keys after the
    tile); `bias` is one call of it on whole rows.
    Positions are used only for the causal restriction (key position <= query position).
    Extends to any length: counts beyond P - 1 are clamped (as in the paper's p_max).
    """
    family = "contextual"
    citation = "Golovneva et al. 2024"
    extrapolates = "yes"
    Options = CopeOptions
    traits = Traits(per_layer=True, needs_full_rows=True, carries_bias=True, bias="tile")

    def __init__(self, options: CopeOptions, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if options.max_positions < 0:
            raise ValueError(f"cope.max_positions must be >= 0 (0 = train_length + 1), got {options.max_positions}")
        self.rows = options.max_positions or dims.train_length + 1
        init = nnx.initializers.normal(stddev=0.02)
        self.table = nnx.Param(init(rngs.params(), (self.rows, dims.head_dim), jnp.float32))

    def gates(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS) -> jax.Array:
        """g_ij, B x H x T x S, float32 (0 where key j is after query i)."""
        logits = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK,
                            preferred_element_type=jnp.float32) * q_BxTxHxK.shape[-1] ** -0.5
        causal_Bx1xTxS = (k_pos_BxS[:, None, :] <= q_pos_BxT[:, :, None])[:, None]
        return jnp.where(causal_Bx1xTxS, jax.nn.sigmoid(logits), 0.0)

    def positions(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS) -> jax.Array:
        """The contextual positions p_ij, B x H x T x S, float32 (0 where j is after i)."""
        return contextual_positions(self.gates(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS))

    def carried_bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, gates_after_BxHxT):
        """The bias of one key tile given the gates summed over the keys after it (per query), and
        that sum extended by this tile: called on key tiles from right to left."""
        gates = self.gates(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
        p = jnp.minimum(contextual_positions(gates) + gates_after_BxHxT[..., None], self.rows - 1)
        z_BxHxTxP = jnp.einsum("bthk,pk->bhtp", q_BxTxHxK.astype(jnp.float32), self.table[...])
        return interpolate_logits(z_BxHxTxP, p), gates_after_BxHxT + gates.sum(-1)

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        b, t, h, _ = q_BxTxHxK.shape
        nothing_after = jnp.zeros((b, h, t), jnp.float32)
        return self.carried_bias(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, nothing_after)[0]
