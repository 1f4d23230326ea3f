"""PoPE: polar positional embedding, content in the magnitude and position in the phase."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.options.rotary import PopeOptions
from posenc.registry import register


def pope_frequencies(head_dim: int, base: float = 10000.0) -> jax.Array:
    """theta_c = base^(-c/K), c = 0 .. K-1: one frequency per feature (RoPE has one per pair)."""
    return 1.0 / base ** (jnp.arange(head_dim, dtype=jnp.float32) / head_dim)


def polar(x_BxTxHxK: jax.Array, angles_BxTxHxK: jax.Array) -> jax.Array:
    """[softplus(x) cos(angle), softplus(x) sin(angle)], B x T x H x 2K float32: each feature as a
    complex number of magnitude softplus(x) >= 0 and phase `angle`, in Cartesian form."""
    magnitude = jax.nn.softplus(x_BxTxHxK.astype(jnp.float32))
    return jnp.concatenate([magnitude * jnp.cos(angles_BxTxHxK), magnitude * jnp.sin(angles_BxTxHxK)], axis=-1)


@register("pope")
class Pope(Scheme):
    """Polar coordinate positional embedding: every feature c of q and k becomes a complex number
    whose magnitude is content only and whose phase is position only,

        q_tc = softplus(q_c) e^(i t theta_c),  k_sc = softplus(k_c) e^(i (s theta_c + delta_hc)),
        logit = Re(sum_c conj(q_tc) k_sc) / sqrt(K) = sum_c softplus(q_c) softplus(k_c)
                                                       cos((s - t) theta_c + delta_hc) / sqrt(K),

    with K frequencies theta_c = base^(-c/K) (one per feature, where RoPE has one per pair) and a
    learned phase bias delta per head and feature, clamped to [-2 pi, 0], initialised at zero. So
    the logit depends on position only through s - t, and a key cannot move its match by its
    content (RoPE mixes the two: its phase is arg(q_c) + m theta_c).

    Gopalakrishnan, Csordás, Schmidhuber & Mozer, "Decoupling the 'What' and 'Where' With Polar
    Coordinate Positional Embeddings", arXiv 2509.10534, 2025. Ported from x-transformers'
    `PolarEmbedding` and `apply_polar_pos_emb` (lucidrains/x-transformers, x_transformers.py): one
    bias of heads x K shared by all layers, and the logit scaled by 1/sqrt(K) of the original head
    size. `rotate` returns q and k in Cartesian form, 2K features per head, q multiplied by sqrt(2)
    so that attention's 1/sqrt(2K) makes that 1/sqrt(K); the value vectors keep K features (the
    paths that need one head size for q, k and v pad v with zeros: models/attention/dense.py,
    `padded_values`).
    """
    family = "relative"
    citation = "Gopalakrishnan et al. 2025"
    extrapolates = "partly"
    Options = PopeOptions

    def __init__(self, options: PopeOptions, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        shape = (dims.num_heads, dims.head_dim)
        if options.bias_init == "uniform":
            bias = jax.random.uniform(rngs.params(), shape, jnp.float32, -2 * math.pi, 0.0)
        else:
            bias = jnp.zeros(shape, jnp.float32)
        self.phase_bias = nnx.Param(bias)

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        theta_K = pope_frequencies(q_BxTxHxK.shape[-1], self.options.base)
        delta_HxK = jnp.clip(self.phase_bias[...], -2 * math.pi, 0.0)
        q_angles = q_pos_BxT.astype(jnp.float32)[:, :, None, None] * theta_K
        k_angles = k_pos_BxS.astype(jnp.float32)[:, :, None, None] * theta_K + delta_HxK
        q_polar = polar(q_BxTxHxK, q_angles) * math.sqrt(2.0)
        return q_polar.astype(q_BxTxHxK.dtype), polar(k_BxSxHxK, k_angles).astype(k_BxSxHxK.dtype)
