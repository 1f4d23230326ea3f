"""Complex-valued word-order embeddings (Wang et al., ICLR 2020), realised with real feature pairs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.registry import register


@register("complex_order")
class ComplexOrder(Scheme):
    """Each token becomes a complex vector whose phase turns linearly with its position:

        f(x, pos)_c = r_c(x) exp(i (w_c(x) pos + theta_c(x))),  c = 1 .. D/2,

    stored as the real vector [r cos(w pos + theta), r sin(w pos + theta)] (real parts, then
    imaginary parts) that replaces the embedding. So f(x, pos + 1) = f(x, pos) rotated by w(x) in
    every pair: the embedding is "linearly transformable in position", the paper's defining property.

    Wang, Zhao, Lioma, Li, Zhang & Simonsen, "Encoding Word Order in Complex Embeddings", ICLR 2020.

    Deviation from the paper: the paper keeps three tables per word j (amplitude r_j, frequency
    w_j, phase theta_j). The `embed` hook sees the embeddings x, not the token ids, so here
    r = x W_r, w = x W_w, theta = x W_theta with learned D x D/2 maps: per-word values as in the
    paper (a function of the word's embedding), at 1.5 D^2 parameters instead of 3 x vocab x D/2.
    D complex features of the paper are D/2 here (d_model must be even). No table of positions:
    it extends to any length (float32 keeps w pos exact enough to well beyond 10^5).
    """
    family = "absolute"
    citation = "Wang et al. 2020"
    extrapolates = "yes"

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        d = dims.d_model
        if d % 2:
            raise ValueError(f"complex_order needs an even model.d_model (real and imaginary halves), got {d}")
        init = nnx.initializers.normal(stddev=d ** -0.5)
        self.amplitude = nnx.Param(init(rngs.params(), (d, d // 2), jnp.float32))
        self.frequency = nnx.Param(init(rngs.params(), (d, d // 2), jnp.float32))
        self.phase = nnx.Param(init(rngs.params(), (d, d // 2), jnp.float32))

    def amplitude_frequency_phase(self, x_BxTxD: jax.Array):
        """r, w, theta, each B x T x D/2, from the embeddings (float32)."""
        x = x_BxTxD.astype(jnp.float32)
        return x @ self.amplitude[...], x @ self.frequency[...], x @ self.phase[...]

    def embed(self, x_BxTxD, positions_BxT):
        r, w, theta = self.amplitude_frequency_phase(x_BxTxD)
        angle = w * positions_BxT.astype(jnp.float32)[..., None] + theta
        return jnp.concatenate([r * jnp.cos(angle), r * jnp.sin(angle)], axis=-1).astype(x_BxTxD.dtype)
