"""Absolute schemes: a position vector added to the token embedding (or nothing at all)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme, check_table_length, register


@register("nope")
class NoPE(Scheme):
    """No positional information; a causal decoder can still infer position from the mask.

    Kazemnejad et al., "The Impact of Positional Encoding on Length Generalization in Transformers",
    NeurIPS 2023.
    """
    family = "none"
    citation = "Kazemnejad et al. 2023"
    extrapolates = "partly"


def sinusoidal_table(positions: jax.Array, d_model: int, base: float = 10000.0) -> jax.Array:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d)).

    `positions` may have any shape; the result has one more axis of size `d_model` (even or odd).
    """
    i = jnp.arange((d_model + 1) // 2, dtype=jnp.float32)
    inv_freq = base ** (-2.0 * i / d_model)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # ... x D/2 x 2: interleaved
    return pe.reshape(*positions.shape, -1)[..., :d_model]


@dataclasses.dataclass(frozen=True)
class SinusoidalOptions:
    base: float = 10000.0


@register("sinusoidal")
class Sinusoidal(Scheme):
    """Fixed sinusoidal position vectors added to the (sqrt(d)-scaled) token embeddings.

    x_k + PE(k), PE(k)_{2i} = sin(k / 10000^{2i/d}), PE(k)_{2i+1} = cos(k / 10000^{2i/d}).
    Vaswani et al., "Attention Is All You Need", NeurIPS 2017.
    """
    family = "absolute"
    citation = "Vaswani et al. 2017"
    extrapolates = "no"
    Options = SinusoidalOptions

    def embed(self, x_BxTxD, positions_BxT):
        return x_BxTxD + sinusoidal_table(positions_BxT, x_BxTxD.shape[-1], self.options.base).astype(x_BxTxD.dtype)


@dataclasses.dataclass(frozen=True)
class LearnedOptions:
    max_length: int = 0  # rows of the table; 0 means the training length


@register("learned")
class Learned(Scheme):
    """A trained table of position vectors, one row per position (Gehring et al. 2017; GPT).

    It cannot encode positions beyond its last row: evaluation beyond `max_length` is refused.
    """
    family = "absolute"
    citation = "Gehring et al. 2017"
    extrapolates = "no"
    Options = LearnedOptions

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        self.rows = options.max_length or dims.train_length
        init = nnx.initializers.normal(stddev=dims.d_model ** -0.5)
        self.table = nnx.Param(init(rngs.params(), (self.rows, dims.d_model), jnp.float32))

    def embed(self, x_BxTxD, positions_BxT):
        return x_BxTxD + jnp.take(self.table[...], positions_BxT, axis=0).astype(x_BxTxD.dtype)

    def check_length(self, length):
        check_table_length("learned", self.rows, length)
