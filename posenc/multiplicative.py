"""Multiplicative absolute encoding: the token embedding times a position vector, x_p * PE(p)."""
from __future__ import annotations


import jax.numpy as jnp
from flax import nnx

from posenc.absolute import sinusoidal_table
from posenc.base import ModelDims, Scheme, check_table_length
from posenc.options.absolute import MultiplicativeOptions
from posenc.registry import register


@register("multiplicative")
class Multiplicative(Scheme):
    """x_p <- x_p * (offset + PE(p)) elementwise, instead of x_p + PE(p); offset = 0 by default.

    We follow the literature's definition x ⊙ p (Su 2021, "让研究人员绞尽脑汁的Transformer位置编码",
    kexue.fm/archives/8130, lists x_k ⊙ p_k as the multiplicative alternative to x_k + p_k).
    With the sinusoidal table, PE(p)_{2i} = sin(p / base^{2i/d}), PE(p)_{2i+1} = cos(...), every
    factor lies in [-1, 1]: the product shrinks features and zeroes the sine features at p = 0
    (the first token keeps only its cosine half); offset = 1 gives x * (1 + PE(p)), a variant that
    keeps the token whole at the cost of a multiplier in [0, 2]. table="learned": a trained table of
    `max_length` rows (initialised to the sinusoidal table), which cannot encode positions beyond
    its last row (LengthError, as `learned`).
    """
    family = "absolute"
    citation = "Su 2021 (blog, kexue.fm/archives/8130)"
    extrapolates = "no"
    Options = MultiplicativeOptions

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if options.table not in ("sinusoidal", "learned"):
            raise ValueError(f"multiplicative.table must be 'sinusoidal' or 'learned', got {options.table!r}")
        if options.table == "learned":
            self.rows = options.max_length or dims.train_length
            init = sinusoidal_table(jnp.arange(self.rows), dims.d_model, options.base)
            self.pos_table = nnx.Param(init)

    def position_vectors(self, positions_BxT):
        """PE(p), B x T x D."""
        if self.options.table == "learned":
            return jnp.take(self.pos_table[...], positions_BxT, axis=0)
        return sinusoidal_table(positions_BxT, self.dims.d_model, self.options.base)

    def embed(self, x_BxTxD, positions_BxT):
        factor = self.options.offset + self.position_vectors(positions_BxT)
        return x_BxTxD * factor.astype(x_BxTxD.dtype)

    def check_length(self, length):
        if self.options.table == "learned":
            check_table_length("multiplicative", self.rows, length, " (table=learned)")
