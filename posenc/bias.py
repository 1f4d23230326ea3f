"""Schemes that add a bias, a function of the query and key positions, to the attention logits."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.kernel_bias import BiasFunction
from posenc.options.bias import T5Options
from posenc.registry import register
from posenc.traits import Traits


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The head slopes of Press et al. (2022), as in their official code.

    For n a power of two, head h (1-based) gets 2^(-8h/n). Otherwise, with p the largest power of
    two below n: the p slopes of p heads, then the first n - p slopes at even 0-based indices of the
    2p-head list, i.e. 2^(-4(2k+1)/p) for k = 0 .. n-p-1.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    p = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * h / p) for h in range(1, p + 1)]
    slopes += [2.0 ** (-4.0 * (2 * k + 1) / p) for k in range(num_heads - p)]
    return np.asarray(slopes, dtype=np.float64)


@register("alibi")
class ALiBi(Scheme):
    """Attention with Linear Biases: logits[h, i, j] += -m_h * (i - j), no position embeddings.

    Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases Enables Input
    Length Extrapolation", ICLR 2022. Slopes m_h from `alibi_slopes`; the bias is added after the
    1/sqrt(d) scaling.
    """
    family = "relative"
    citation = "Press et al. 2022"
    extrapolates = "yes"
    traits = Traits(bias="function")

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        slopes_H = jnp.asarray(alibi_slopes(self.dims.num_heads), jnp.float32)
        distance_BxTxS = (q_pos_BxT[:, :, None] - k_pos_BxS[:, None, :]).astype(jnp.float32)
        return -slopes_H[None, :, None, None] * distance_BxTxS[:, None, :, :]

    def bias_fn(self):
        slopes_H = jnp.asarray(alibi_slopes(self.dims.num_heads), jnp.float32)
        return BiasFunction(_alibi_tile, per_head=slopes_H, learned=False)


def _alibi_tile(shared, slope, q_pos_Qx1, k_pos_1xS):
    return -slope * (q_pos_Qx1 - k_pos_1xS).astype(jnp.float32)


def t5_relative_position_bucket(relative_position, bidirectional: bool = True,
                                num_buckets: int = 32, max_distance: int = 128):
    """T5's bucket of relative_position = key position - query position (Raffel et al. 2020).

    Half of the buckets (per direction) hold exact distances 0 .. max_exact-1; the rest cover
    distances up to max_distance logarithmically; farther distances share the last bucket.
    Works on numpy or JAX integer arrays and returns a JAX int32 array.
    """
    n = -jnp.asarray(relative_position, dtype=jnp.int32)
    bucket = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(n < max_exact, n, large)


@register("t5")
class T5Bias(Scheme):
    """T5 relative position bias: a learned scalar per (bucket of i - j, head), shared by all layers.

    Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
    Transformer", JMLR 2020.
    """
    family = "relative"
    citation = "Raffel et al. 2020"
    extrapolates = "partly"
    Options = T5Options
    traits = Traits(bias="function")

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        init = nnx.initializers.normal(stddev=0.02)
        self.table = nnx.Param(init(rngs.params(), (options.num_buckets, dims.num_heads), jnp.float32))

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        buckets_BxTxS = t5_relative_position_bucket(
            k_pos_BxS[:, None, :] - q_pos_BxT[:, :, None], self.options.bidirectional,
            self.options.num_buckets, self.options.max_distance)
        return jnp.moveaxis(jnp.take(self.table[...], buckets_BxTxS, axis=0), -1, 1)

    def bias_fn(self):
        o = self.options

        def bucket(q_pos_Qx1, k_pos_1xS):
            return t5_relative_position_bucket(k_pos_1xS - q_pos_Qx1, o.bidirectional, o.num_buckets,
                                               o.max_distance)
        # Causal buckets stop at the last one from max_distance on (bidirectional: for keys in the past).
        return BiasFunction(None, table=self.table[...].T, index=bucket, constant_beyond=o.max_distance,
                            relative_index=True)
