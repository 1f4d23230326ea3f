"""Absolute schemes: a position vector added to the token embedding (or nothing at all)."""
from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme, check_table_length
from posenc.options.absolute import LearnedOptions, SinusoidalOptions
from posenc.registry import register


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


def fairseq_sinusoidal_table(positions: jax.Array, d_model: int, base: float = 10000.0) -> jax.Array:
    """fairseq's `SinusoidalPositionalEmbedding` (also tensor2tensor's timing signal): with h = d/2,
    PE[p, i] = sin(p * base^(-i/(h-1))) and PE[p, h + i] = cos(p * base^(-i/(h-1))), i = 0 .. h-1:
    the sines, then the cosines, frequencies spread over h - 1 steps (the last is exactly 1/base);
    an odd width gets a zero last column. `positions` may have any shape. Needs d_model >= 4.
    """
    half = d_model // 2
    if half < 2:
        raise ValueError(f"the fairseq sinusoidal table needs d_model >= 4, got {d_model}; "
                         f"use --config.posenc.sinusoidal.layout=vaswani")
    inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / (half - 1))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    pe = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    if d_model % 2:
        pe = jnp.concatenate([pe, jnp.zeros((*positions.shape, 1), pe.dtype)], axis=-1)
    return pe


FAIRSEQ_POSITION_OFFSET = 2  # fairseq numbers positions from padding_idx + 1, and padding_idx = 1


@register("sinusoidal")
class Sinusoidal(Scheme):
    """Fixed sinusoidal position vectors added to the (sqrt(d)-scaled) token embeddings.

    Default `layout=fairseq`, the table the ALiBi paper's sinusoidal baseline used (Press et al.
    2022 trained it with fairseq): [sin(p w_0) .. sin(p w_{h-1}), cos(p w_0) .. cos(p w_{h-1})],
    w_i = 10000^(-i/(h-1)), h = d/2, and token t (from 0) at p = t + 2, since fairseq's
    `make_positions` counts from padding_idx + 1 = 2 (fairseq `SinusoidalPositionalEmbedding`,
    `utils.make_positions`; tensor2tensor's `get_timing_signal_1d`, the original paper's code, has
    the same [sin | cos] table, from position 0). `layout=vaswani` is the paper's equation:
    PE(p)_{2i} = sin(p / 10000^{2i/d}), PE(p)_{2i+1} = cos(p / 10000^{2i/d}), interleaved, p = t.
    Both are fixed; the choice matters when comparing numbers with the ALiBi paper's Table 2.
    Vaswani et al., "Attention Is All You Need", NeurIPS 2017.
    """
    family = "absolute"
    citation = "Vaswani et al. 2017"
    extrapolates = "no"
    Options = SinusoidalOptions

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if options.layout not in ("fairseq", "vaswani"):
            raise ValueError(f"sinusoidal.layout must be 'fairseq' or 'vaswani', got {options.layout!r}")
        if options.layout == "fairseq" and dims.d_model < 4:
            raise ValueError(f"the fairseq sinusoidal table needs d_model >= 4, got {dims.d_model}; "
                             f"use --config.posenc.sinusoidal.layout=vaswani")

    def table(self, positions_BxT: jax.Array, d_model: int) -> jax.Array:
        if self.options.layout == "fairseq":
            return fairseq_sinusoidal_table(positions_BxT + FAIRSEQ_POSITION_OFFSET, d_model, self.options.base)
        return sinusoidal_table(positions_BxT, d_model, self.options.base)

    def embed(self, x_BxTxD, positions_BxT):
        return x_BxTxD + self.table(positions_BxT, x_BxTxD.shape[-1]).astype(x_BxTxD.dtype)


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
