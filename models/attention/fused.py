"""The fused path: causal attention through `jax.nn.dot_product_attention` (cuDNN's fused kernel on
GPU, an XLA composite elsewhere); which schemes it takes is its row in paths.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.attention.dense import padded_values
from posenc import Scheme


def fused_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                    context_BxTxC: jax.Array | None = None) -> jax.Array:
    """Causal attention for schemes whose positional signal is a rotation and / or an additive bias
    (a `context_bias` from the layer's input included): no `logit_scale`, no `value_bias`, no logit
    transform, softmax weights (paths.py refuses the others). The bias is materialised for the whole
    sequence."""
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    bias = scheme.bias(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    if context_BxTxC is not None:
        from_input = scheme.context_bias(context_BxTxC, context_BxTxC, q_pos_BxT, k_pos_BxT)
        if from_input is not None:
            bias = from_input if bias is None else bias + from_input
    if bias is not None:
        b, t, h, _ = q_BxTxHxK.shape
        bias = jnp.broadcast_to(bias, (b, h, t, t)).astype(q_BxTxHxK.dtype)
    v = padded_values(v_BxTxHxK, q_BxTxHxK.shape[-1])
    out = jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v, bias=bias, is_causal=True)
    return out[..., :v_BxTxHxK.shape[-1]]
