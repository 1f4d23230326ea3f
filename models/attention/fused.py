"""The fused path: causal attention through `jax.nn.dot_product_attention`, with its implementation
named: cuDNN's fused attention on a GPU (`implementation="cudnn"`; shapes and dtypes it cannot take are
refused with the reason, `cudnn_refusal`), XLA's composite elsewhere (`implementation="xla"`). Which
schemes it takes is its row in paths.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.attention.dense import padded_values
from posenc import Scheme

CUDNN_DTYPES = ("float16", "bfloat16")
CUDNN_MAX_HEAD_DIM = 128  # cuDNN's fused attention for every GPU generation jax supports it on


def implementation() -> str:
    """What `fused` calls here: "cudnn" on a GPU, "xla" on every other backend."""
    return "cudnn" if jax.default_backend() == "gpu" else "xla"


def cudnn_refusal(dtype, head_dim: int) -> str | None:
    """Why cuDNN's fused attention cannot take this call, or None: float16 or bfloat16 only, head
    dimensions a multiple of 8 up to CUDNN_MAX_HEAD_DIM."""
    name = jnp.dtype(dtype).name
    if name not in CUDNN_DTYPES:
        why = f"cuDNN's fused attention takes float16 or bfloat16, not {name} (set model.dtype=bfloat16)"
    elif head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
        why = (f"cuDNN's fused attention takes head dimensions that are multiples of 8 up to {CUDNN_MAX_HEAD_DIM}, "
               f"not {head_dim}")
    else:
        return None
    return f"model.attention=fused: {why}; use model.attention=auto, triangular or dense"


def fused_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                    context_BxTxC: jax.Array | None = None) -> jax.Array:
    """Causal attention for schemes whose positional signal is a rotation and / or an additive bias
    (a `context_bias` from the layer's input included): no `logit_scale`, no `value_bias`, no logit
    transform, softmax weights (paths.py refuses the others). The bias is materialised for the whole
    sequence. On a GPU it runs cuDNN's kernel or raises `cudnn_refusal`'s reason (ValueError)."""
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
    kind = implementation()
    if kind == "cudnn":
        why = cudnn_refusal(q_BxTxHxK.dtype, q_BxTxHxK.shape[-1])
        if why:
            raise ValueError(why)
    out = jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v, bias=bias, is_causal=True, implementation=kind)
    return out[..., :v_BxTxHxK.shape[-1]]
