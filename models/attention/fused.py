"""The fused path: causal attention through `jax.nn.dot_product_attention`, with its implementation
named: cuDNN's fused attention on a GPU (`implementation="cudnn"`), XLA's composite elsewhere
(`implementation="xla"`). Which schemes it takes is its row in paths.py, and so is what cuDNN
cannot take (`cudnn_refusal`, which its row asks on a GPU): the kernel trusts its caller."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.attention.dense import padded_values
from posenc import Scheme

CUDNN_DTYPES = ("float16", "bfloat16")


def implementation() -> str:
    """What `fused` calls here: "cudnn" on a GPU, "xla" on every other backend."""
    return "cudnn" if jax.default_backend() == "gpu" else "xla"


def cudnn_max_head_dim() -> int:
    """The widest head cuDNN's fused attention takes through jax: 256 from Hopper (compute capability
    9.0) on, 128 before (jax's `check_is_flash_attention`)."""
    capability = getattr(jax.devices()[0], "compute_capability", None)
    try:
        major = int(str(capability).split(".")[0])
    except ValueError:
        major = 0
    return 256 if major >= 9 else 128


def cudnn_refusal(dtype: str, head_dim: int, length: int, training: bool) -> str | None:
    """Why cuDNN's fused attention cannot take this call, or None: float16 or bfloat16 only, head
    dimensions a multiple of 8 up to `cudnn_max_head_dim`, and in training (its backward pass) an
    even sequence length: jax refuses odd ones there with or without a bias ("Unsupported sequence
    length Q 417, KV 417"; tests/models/attention/test_fused.py runs jax's own check)."""
    widest = cudnn_max_head_dim()
    if dtype not in CUDNN_DTYPES:
        why = f"cuDNN's fused attention takes float16 or bfloat16, not {dtype} (set model.dtype=bfloat16)"
    elif head_dim % 8 or head_dim > widest:
        why = f"cuDNN's fused attention takes head dimensions that are multiples of 8 up to {widest}, not {head_dim}"
    elif training and length % 2:
        why = f"cuDNN's fused attention trains on even sequence lengths only, not {length}"
    else:
        return None
    return f"model.attention=fused: {why}; use model.attention=auto, triangular or dense"


def fused_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                    context_BxTxC: jax.Array | None = None) -> jax.Array:
    """Causal attention for schemes whose positional signal is a rotation and / or an additive bias
    (a `context_bias` from the layer's input included): no `logit_scale`, no `value_bias`, no logit
    transform, softmax weights (paths.py refuses the others). The bias is materialised for the whole
    sequence. On a GPU it runs cuDNN's kernel (its row in paths.py has refused what cuDNN cannot take)."""
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
    out = jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v, bias=bias, is_causal=True,
                                       implementation=implementation())
    return out[..., :v_BxTxHxK.shape[-1]]
