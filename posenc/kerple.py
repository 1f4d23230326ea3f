"""KERPLE: logits biases from conditionally positive definite kernels of the distance |i - j|."""
from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.kernel_bias import BiasFunction
from posenc.options.bias import KerpleLogOptions, KerplePowerOptions
from posenc.registry import register
from posenc.traits import Traits


def inverse_softplus(y: jax.Array) -> jax.Array:
    """x with softplus(x) = y, for y > 0."""
    return y + jnp.log(-jnp.expm1(-y))


def inverse_sigmoid(y: jax.Array) -> jax.Array:
    """x with sigmoid(x) = y, for 0 < y < 1."""
    return jnp.log(y) - jnp.log1p(-y)


def head_distances(q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> jax.Array:
    """|i - j| as float32, B x 1 x T x S (broadcasts over heads)."""
    return jnp.abs(q_pos_BxT[:, :, None] - k_pos_BxS[:, None, :]).astype(jnp.float32)[:, None]


def _uniform_per_head(rngs: nnx.Rngs, num_heads: int, low: float, high: float) -> jax.Array:
    return jax.random.uniform(rngs.params(), (num_heads,), jnp.float32, low, high)


@register("kerple_log")
class KerpleLog(Scheme):
    """KERPLE, logarithmic variant: logits[h, i, j] += -r1_h * log(1 + r2_h * |i - j|).

    r1_h, r2_h > 0 are learned per head, kept positive as softplus of unconstrained parameters.
    Initialised uniformly in (0.01, 2) and (0.01, 1). One set serves every layer: the authors'
    code (chijames/KERPLE, GPT-NeoX) builds one KERPLE module and passes it to all layers;
    `per_layer=True` gives each layer its own (our earlier default).
    Chi, Fan, Ramadge & Rudnicky, "KERPLE: Kernelized Relative Positional Embedding for Length
    Extrapolation", NeurIPS 2022. The bias is added after the 1/sqrt(d) scaling.
    """
    family = "relative"
    citation = "Chi et al. 2022"
    extrapolates = "yes"
    Options = KerpleLogOptions
    traits = Traits(bias="function")  # per layer with option per_layer

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        self.traits = self.traits.replace(per_layer=options.per_layer)
        r1 = _uniform_per_head(rngs, dims.num_heads, options.init_min, options.r1_init_max)
        r2 = _uniform_per_head(rngs, dims.num_heads, options.init_min, options.r2_init_max)
        self.r1_raw = nnx.Param(inverse_softplus(r1))
        self.r2_raw = nnx.Param(inverse_softplus(r2))

    def coefficients(self) -> tuple[jax.Array, jax.Array]:
        """(r1, r2), each of shape H."""
        return jax.nn.softplus(self.r1_raw[...]), jax.nn.softplus(self.r2_raw[...])

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        r1_H, r2_H = self.coefficients()
        distance = head_distances(q_pos_BxT, k_pos_BxS)
        return -r1_H[:, None, None] * jnp.log1p(r2_H[:, None, None] * distance)

    def bias_fn(self):
        def tile(shared, head, q_pos_Qx1, k_pos_1xS):
            r1, r2 = head
            return -r1 * jnp.log1p(r2 * jnp.abs(q_pos_Qx1 - k_pos_1xS).astype(jnp.float32))
        return BiasFunction(tile, per_head=self.coefficients())


@register("kerple_power")
class KerplePower(Scheme):
    """KERPLE, power variant: logits[h, i, j] += -r1_h * |i - j|^r2_h, r1_h > 0, 0 < r2_h <= 2.

    Learned per head: r1 = softplus(.), r2 = 2 * sigmoid(.), so 0 < r2 < 2. Initialised uniformly
    in (0.01, 1) and (0.01, 1.99). Shared by every layer as in the authors' code (one module for
    the stack); `per_layer=True` gives each layer its own.
    Chi, Fan, Ramadge & Rudnicky, "KERPLE: Kernelized Relative Positional Embedding for Length
    Extrapolation", NeurIPS 2022.
    """
    family = "relative"
    citation = "Chi et al. 2022"
    extrapolates = "yes"
    Options = KerplePowerOptions
    traits = Traits(bias="function")  # per layer with option per_layer

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if not 0 < options.init_min < options.r2_init_max < 2:
            raise ValueError(f"kerple_power needs 0 < init_min < r2_init_max < 2, got "
                             f"{options.init_min} and {options.r2_init_max}")
        self.traits = self.traits.replace(per_layer=options.per_layer)
        r1 = _uniform_per_head(rngs, dims.num_heads, options.init_min, options.r1_init_max)
        r2 = _uniform_per_head(rngs, dims.num_heads, options.init_min, options.r2_init_max)
        self.r1_raw = nnx.Param(inverse_softplus(r1))
        self.r2_raw = nnx.Param(inverse_sigmoid(r2 / 2.0))

    def coefficients(self) -> tuple[jax.Array, jax.Array]:
        """(r1, r2), each of shape H."""
        return jax.nn.softplus(self.r1_raw[...]), 2.0 * jax.nn.sigmoid(self.r2_raw[...])

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        r1_H, r2_H = self.coefficients()
        return -r1_H[:, None, None] * _power(head_distances(q_pos_BxT, k_pos_BxS), r2_H[:, None, None])

    def bias_fn(self):
        def tile(shared, head, q_pos_Qx1, k_pos_1xS):
            r1, r2 = head
            return -r1 * _power(jnp.abs(q_pos_Qx1 - k_pos_1xS).astype(jnp.float32), r2)
        return BiasFunction(tile, per_head=self.coefficients())


def _power(distance: jax.Array, exponent: jax.Array) -> jax.Array:
    """d^r = exp(r log d) for d > 0 and 0 at d = 0, without a log(0) in the gradient."""
    safe_log = jnp.log(jnp.where(distance > 0, distance, 1.0))
    return jnp.where(distance > 0, jnp.exp(exponent * safe_log), 0.0)
