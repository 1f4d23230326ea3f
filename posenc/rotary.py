"""Rotary position embedding: rotate query and key so that their dot product sees only m - n."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.base import Scheme, register


def rope_inverse_frequencies(rotary_dim: int, base: float = 10000.0) -> jax.Array:
    """theta_i = base^(-2i / rotary_dim), i = 0 .. rotary_dim/2 - 1 (Su et al. 2021)."""
    return base ** (-jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)


def apply_rotary(x_BxTxHxK: jax.Array, positions_BxT: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate the first 2*len(inv_freq) features of every head by angle position * theta_i.

    Pairs are (i, i + R/2) ("rotate half" layout); any fixed pairing gives the same scheme.
    """
    rotary_dim = 2 * inv_freq.shape[0]
    x_rot, x_pass = x_BxTxHxK[..., :rotary_dim], x_BxTxHxK[..., rotary_dim:]
    angles_BxTxR2 = positions_BxT.astype(jnp.float32)[..., None] * inv_freq
    cos = jnp.cos(angles_BxTxR2)[:, :, None, :]
    sin = jnp.sin(angles_BxTxR2)[:, :, None, :]
    x1, x2 = jnp.split(x_rot.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return jnp.concatenate([rotated.astype(x_BxTxHxK.dtype), x_pass], axis=-1)


@dataclasses.dataclass(frozen=True)
class RopeOptions:
    base: float = 10000.0
    fraction: float = 1.0  # share of each head's features that are rotated (partial rotary)


@register("rope")
class Rope(Scheme):
    """Rotary position embedding (RoFormer).

    q_m <- R(m theta) q_m, k_n <- R(n theta) k_n, with 2x2 rotations of feature pairs at angles
    m * theta_i, theta_i = base^(-2i/d); then <R(m theta) q, R(n theta) k> = <q, R((n - m) theta) k>.
    Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    """
    family = "relative"
    citation = "Su et al. 2021"
    Options = RopeOptions

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        rotary_dim = int(self.dims.head_dim * self.options.fraction) // 2 * 2
        if rotary_dim == 0:
            return q_BxTxHxK, k_BxSxHxK
        inv_freq = rope_inverse_frequencies(rotary_dim, self.options.base)
        return (apply_rotary(q_BxTxHxK, q_pos_BxT, inv_freq),
                apply_rotary(k_BxSxHxK, k_pos_BxS, inv_freq))
