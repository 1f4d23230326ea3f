"""Hierarchical decomposition: a learned table of n rows extended to n^2 positions (Su 2020)."""
from __future__ import annotations

import math

import jax.numpy as jnp

from posenc.absolute import Learned
from posenc.base import LengthError
from posenc.options.absolute import HierarchicalOptions
from posenc.registry import register


def hierarchical_positions(table_NxD: jnp.ndarray, positions, alpha: float) -> jnp.ndarray:
    """u_p for p = i n + j (0 <= i, j < n): u_p = alpha q_i + (1 - alpha) q_j with
    q_i = (t_i - alpha t_0) / (1 - alpha), t the table.

    Expanded, u_p = t_j + alpha / (1 - alpha) (t_i - t_0): the same value, written so that for
    p < n (i = 0) it is t_p exactly, not up to rounding.
    """
    n = table_NxD.shape[0]
    i, j = positions // n, positions % n
    t_i, t_j = jnp.take(table_NxD, i, axis=0), jnp.take(table_NxD, j, axis=0)
    return t_j + (alpha / (1.0 - alpha)) * (t_i - table_NxD[0])


@register("hierarchical")
class Hierarchical(Learned):
    """A learned absolute table t_0 .. t_{n-1}, extended to n^2 positions at evaluation.

    Su's hierarchical decomposition (1-based in the post): q_i = (p_i - alpha p_1)/(1 - alpha),
    u_{(i-1)n+j} = alpha q_i + (1 - alpha) q_j. 0-based, p = i n + j: u_p = alpha q_i +
    (1 - alpha) q_j, q_i = (t_i - alpha t_0)/(1 - alpha), computed as t_j + alpha/(1 - alpha)
    (t_i - t_0); so u_p = t_p for p < n (training is exactly `learned`) and positions up to
    n^2 - 1 are defined; beyond, LengthError. alpha = 0.4 (Su's choice), 0 < alpha < 1, changes
    no parameter. Su, "层次分解位置编码，让BERT可以处理超长文本" (2020), kexue.fm/archives/7947.
    """
    family = "absolute"
    citation = "Su 2020 (blog, kexue.fm/archives/7947)"
    extrapolates = "partly"  # to n^2 positions, n = the table's rows
    Options = HierarchicalOptions

    def __init__(self, options, dims, *, rngs):
        if not 0.0 < options.alpha < 1.0:
            raise ValueError(f"hierarchical.alpha must lie in (0, 1), got {options.alpha}")
        super().__init__(options, dims, rngs=rngs)

    def embed(self, x_BxTxD, positions_BxT):
        u = hierarchical_positions(self.table[...], positions_BxT, self.options.alpha)
        return x_BxTxD + u.astype(x_BxTxD.dtype)

    def check_length(self, length):
        limit = self.rows ** 2
        if length > limit:
            raise LengthError(
                f"positional scheme 'hierarchical' extends its table of {self.rows} positions to "
                f"{limit} but length {length} was requested; train with "
                f"--config.posenc.hierarchical.max_length={math.isqrt(length - 1) + 1} (or larger), "
                f"or evaluate at lengths <= {limit}")
