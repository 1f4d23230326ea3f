"""FIRE: a learned function of the progressively normalised distance as the logits bias."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme, register
from posenc.kerple import inverse_softplus


@dataclasses.dataclass(frozen=True)
class FireOptions:
    hidden: int = 32               # width of f_theta's hidden layer
    c_init: float = 1.0            # initial c of psi(x) = log(c x + 1)
    threshold_init: float = 0.0    # initial L; 0 means the training length


@register("fire")
class Fire(Scheme):
    """FIRE: logits[h, i, j] += f_theta(psi(i - j) / psi(max(L, i)))_h, psi(x) = log(c x + 1).

    f_theta: R -> R^H is an MLP with one hidden ReLU layer (width `hidden`, 32 by default) and one
    output per head; c > 0 (softplus of a parameter) and the threshold L are learned. Normalising
    by the query position makes every distance seen at any length fall in [0, 1] ("progressive
    interpolation"); L keeps short contexts from being stretched. max(L, i) depends on the query
    position only, so a tile's bias is its block of the full bias. Every layer has its own
    parameters (`per_layer`). Our initialisation: c = 1, L = the training length, the MLP as
    `nnx.Linear` (LeCun normal weights, zero biases). i - j is clipped at 0 for keys after the
    query (masked in a decoder) so that psi stays finite. The denominator uses max(L, i, 1), which
    differs from psi(max(L, i)) only at i = 0 with L < 1, where the numerator is psi(0) = 0.
    Li et al., "Functional Interpolation for Relative Positions Improves Long Context
    Transformers", ICLR 2024.
    """
    family = "relative"
    citation = "Li et al. 2024"
    extrapolates = "yes"
    Options = FireOptions
    per_layer = True

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if options.hidden < 1 or options.c_init <= 0 or options.threshold_init < 0:
            raise ValueError("fire needs hidden >= 1, c_init > 0 and threshold_init >= 0")
        lecun = nnx.initializers.lecun_normal()
        self.c_raw = nnx.Param(inverse_softplus(jnp.asarray(options.c_init, jnp.float32)))
        self.threshold = nnx.Param(jnp.asarray(options.threshold_init or dims.train_length, jnp.float32))
        self.w1 = nnx.Param(lecun(rngs.params(), (1, options.hidden), jnp.float32)[0])
        self.b1 = nnx.Param(jnp.zeros((options.hidden,), jnp.float32))
        self.w2 = nnx.Param(lecun(rngs.params(), (options.hidden, dims.num_heads), jnp.float32))
        self.b2 = nnx.Param(jnp.zeros((dims.num_heads,), jnp.float32))

    def normalized_distance(self, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> jax.Array:
        """psi(i - j) / psi(max(L, i)), B x T x S."""
        c = jax.nn.softplus(self.c_raw[...])
        distance = jnp.maximum(q_pos_BxT[:, :, None] - k_pos_BxS[:, None, :], 0).astype(jnp.float32)
        query = jnp.maximum(jnp.maximum(q_pos_BxT.astype(jnp.float32), self.threshold[...]), 1.0)
        return jnp.log1p(c * distance) / jnp.log1p(c * query)[:, :, None]

    def mlp(self, x: jax.Array) -> jax.Array:
        """f_theta on every element of x (any shape ...), ... -> H x ... (heads first).

        Summed over hidden units one at a time so that no (..., hidden) array is materialised."""
        w1, b1, w2 = self.w1[...], self.b1[...], self.w2[...]
        extra = (slice(None),) + (None,) * x.ndim

        def add_unit(u, total):
            return total + w2[u][extra] * jax.nn.relu(w1[u] * x + b1[u])[None]

        start = jnp.broadcast_to(self.b2[...][extra], (w2.shape[1], *x.shape))
        return jax.lax.fori_loop(0, w1.shape[0], add_unit, start)

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        x_BxTxS = self.normalized_distance(q_pos_BxT, k_pos_BxS)
        return jnp.moveaxis(self.mlp(x_BxTxS), 0, 1)
