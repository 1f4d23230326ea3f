"""Sandwich: the inner product of two sinusoidal position vectors as a parameter-free logits bias."""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from posenc.base import Scheme
from posenc.kernel_bias import BiasFunction
from posenc.options.bias import SandwichOptions
from posenc.registry import register
from posenc.traits import Traits


def sandwich_compression(num_heads: int) -> np.ndarray:
    """The per-head divisor 8h/H, h = 1 .. H: ALiBi's exponents (its slopes are 2^(-8h/H))."""
    return 8.0 * np.arange(1, num_heads + 1) / num_heads


def sinusoid_inner_product(distance: jax.Array, dim: int, base: float = 10000.0,
                           unrolled: bool = False) -> jax.Array:
    """sum_{k=1}^{dim/2} cos(distance / base^(2k/dim)) = p_i . p_j for sinusoidal p of width dim
    (frequencies k = 1 .. dim/2 as in the paper), for integer distances i - j of any shape.

    Summed one frequency at a time in a fixed order: elementwise, so a value does not depend on the
    shape of the array it sits in, and no (..., dim/2) intermediate is materialised. `unrolled`:
    a Python loop with the frequencies as constants (inside a GPU kernel, which cannot index a vector).
    """
    distance = distance.astype(jnp.float32)
    if unrolled:
        total = jnp.zeros_like(distance)
        for k in range(1, dim // 2 + 1):
            total = total + jnp.cos(distance * np.float32(base ** (-2.0 * k / dim)))
        return total
    inv_freq = base ** (-2.0 * jnp.arange(1, dim // 2 + 1, dtype=jnp.float32) / dim)

    def add_frequency(k, total):
        return total + jnp.cos(distance * inv_freq[k])

    return jax.lax.fori_loop(0, dim // 2, add_frequency, jnp.zeros_like(distance))


def distance_function(fn, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> jax.Array:
    """fn(i - j) for every (query, key) pair, B x T x S, for an elementwise `fn` of int32 distances.

    When every row's positions are consecutive (the usual case) only the T + S - 1 distinct
    distances are evaluated and then gathered; otherwise every pair is. Both give the same values.
    """
    t, s = q_pos_BxT.shape[1], k_pos_BxS.shape[1]
    consecutive = (jnp.all(q_pos_BxT == q_pos_BxT[:, :1] + jnp.arange(t))
                   & jnp.all(k_pos_BxS == k_pos_BxS[:, :1] + jnp.arange(s)))

    def by_table(_):
        offsets_D = jnp.arange(-(s - 1), t)
        table_BxD = fn(q_pos_BxT[:, :1] - k_pos_BxS[:, :1] + offsets_D)
        index_TxS = jnp.arange(t)[:, None] - jnp.arange(s)[None, :] + (s - 1)
        return table_BxD[:, index_TxS]

    def by_pair(_):
        return fn(q_pos_BxT[:, :, None] - k_pos_BxS[:, None, :])

    return jax.lax.cond(consecutive, by_table, by_pair, None)


@register("sandwich")
class Sandwich(Scheme):
    """Sandwich: logits[h, i, j] += (p_i . p_j - d'/2) / (8h/H), no parameters.

    p_i . p_j = sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d')), the inner product of two sinusoidal
    position vectors of width d' (default 128), which depends only on i - j and decays roughly
    logarithmically with the distance. As in the paper, every head h = 1 .. H divides it by its
    compression ratio 8h/H (the exponents of ALiBi's slopes, 2^(-8h/H)), so heads see
    differently stretched copies. We subtract d'/2 (the value at distance 0) so that the bias is 0
    on the diagonal and negative elsewhere; a per-head constant, it leaves the softmax unchanged.
    Chi, Fan, Rudnicky & Ramadge, "Dissecting Transformer Length Extrapolation via the Lens of
    Receptive Field Analysis", ACL 2023. The bias is added after the 1/sqrt(d) scaling.

    d' is a hyperparameter of its own in the paper's formula (not the model width); we keep 128 and
    offer `dim=0` for the head dimension, which NeMo's `SandwichRelativePositionEmbedding` is given.
    NeMo's `sandwich_pos_bias` also differs otherwise: it sums the angles (i - j) w_k without the
    cosine (a bias linear in the distance, ALiBi-like) and uses k = 1 .. d'/2 - 1; we follow the
    paper's inner product.
    """
    family = "relative"
    citation = "Chi et al. 2023"
    extrapolates = "yes"
    Options = SandwichOptions
    traits = Traits(bias="function")

    def __init__(self, options, dims, *, rngs):
        super().__init__(options, dims, rngs=rngs)
        self.dim = options.dim or dims.head_dim
        if self.dim < 2 or self.dim % 2:
            raise ValueError(f"sandwich.dim must be even and >= 2 (or 0 for the head dimension), got {self.dim}")

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        inner_BxTxS = distance_function(
            lambda d: sinusoid_inner_product(d, self.dim, self.options.base), q_pos_BxT, k_pos_BxS)
        ratio_H = jnp.asarray(sandwich_compression(self.dims.num_heads), jnp.float32)
        return (inner_BxTxS[:, None] - self.dim / 2) / ratio_H[None, :, None, None]

    def bias_fn(self):
        dim, base = self.dim, self.options.base

        def tile(shared, ratio, q_pos_Qx1, k_pos_1xS):
            return (sinusoid_inner_product(q_pos_Qx1 - k_pos_1xS, dim, base, unrolled=True) - dim / 2) / ratio
        return BiasFunction(tile, per_head=jnp.asarray(sandwich_compression(self.dims.num_heads), jnp.float32),
                            learned=False)
