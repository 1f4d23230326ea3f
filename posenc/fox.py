"""The Forgetting Transformer (FoX): a forget gate per head, computed from the layer's input."""
from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.options.content import FoxOptions
from posenc.registry import register
from posenc.traits import Traits


@register("fox")
class ForgettingTransformer(Scheme):
    """Forgetting Attention: every layer has a forget gate per head and token,
    f_l = sigmoid(w_h . x_l + b_h) (x_l the layer's input after its norm), and query i's logit for
    key j gets the log of the gates between them,

        bias_ij = sum_{j < l <= i} log f_l = c_i - c_j,    c_i = sum_{l <= i} log f_l,

    a decay learned from the data instead of a fixed slope (ALiBi is the case f_l = e^(-m)). No other
    positional signal: the gates' order is the sequence's.

    Lin, Nikishin, He & Courville, "Forgetting Transformer: Softmax Attention with a Forget Gate",
    ICLR 2025 (zhixuan-lin/forgetting-transformer: `fgate_proj`, a D -> H linear map with a bias,
    weights N(0, 0.02^2), bias 0; log f = logsigmoid in float32; log_lambda = cumsum(log f)); the
    basic FoX, not the "Pro" block (output gate, QK-norm, key / value shift). x-transformers'
    `attn_data_dependent_alibi` is the same bias with the gate bias starting at 5
    (`gate_bias_init=5`).

    Hooks: `token_context` gives c (B x T x H, float32) once per layer over the whole sequence, and
    `context_bias` the tile's c_i - c_j, so blockwise evaluation cuts the running sum, never
    recomputes it per tile: memory stays O(T x block). The triangular, fused, dense and blockwise
    paths take it; the Pallas kernel, whose bias is a function of positions only, refuses it.
    """
    family = "data-dependent"
    citation = "Lin et al. 2025"
    extrapolates = "yes"
    Options = FoxOptions
    traits = Traits(per_layer=True, reads_input=True)

    def __init__(self, options: FoxOptions, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        init = nnx.initializers.normal(stddev=0.02)
        self.gate_w = nnx.Param(init(rngs.params(), (dims.d_model, dims.num_heads), jnp.float32))
        self.gate_b = nnx.Param(jnp.full((dims.num_heads,), options.gate_bias_init, jnp.float32))

    def log_forget(self, x_BxTxD: jax.Array) -> jax.Array:
        """log f, B x T x H, float32."""
        logits = jnp.einsum("btd,dh->bth", x_BxTxD.astype(jnp.float32), self.gate_w[...]) + self.gate_b[...]
        return jax.nn.log_sigmoid(logits)

    def token_context(self, x_BxTxD, positions_BxT):
        """c_i = sum_{l <= i} log f_l along the sequence (positions increase along it), B x T x H."""
        return jnp.cumsum(self.log_forget(x_BxTxD), axis=1)

    def context_bias(self, q_ctx_BxTxH, k_ctx_BxSxH, q_pos_BxT, k_pos_BxS):
        return jnp.moveaxis(q_ctx_BxTxH[:, :, None, :] - k_ctx_BxSxH[:, None, :, :], -1, 1)
