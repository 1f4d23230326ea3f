"""Dense attention (one call of each hook over the whole T x S matrix) and what the other paths
share with it: NEG_INF and the logits of one tile (from tiles.py), the attention-dropout pair, the
value-term probe; and the fused path."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models.attention.stickbreaking import stickbreaking_dense
from models.attention.tiles import NEG_INF, tile_logits
from posenc import Scheme

__all__ = ["NEG_INF", "NO_DROPOUT", "Dropout", "adds_value_term", "dense_attention", "fused_attention",
           "tile_logits"]


@dataclasses.dataclass(frozen=True)
class Dropout:
    """Attention dropout: the rate, and the key to draw its mask from (None: evaluation, no dropout)."""
    rate: float = 0.0
    key: jax.Array | None = None

    @property
    def active(self) -> bool:
        return self.key is not None and self.rate > 0


NO_DROPOUT = Dropout()


def dense_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme: Scheme,
                    mask_TxS: jax.Array, dropout: Dropout = NO_DROPOUT,
                    context_BxTxC: jax.Array | None = None) -> jax.Array:
    """softmax(scale * q k^T / sqrt(K) + bias) v (+ value bias), with one call of each hook.

    `mask_TxS` is True where a query may attend to a key (the causal order of the sequence, which
    is independent of the position values a scheme is given). Logits and softmax are float32.
    `context_BxTxC`: the scheme's `token_context` of the layer's input (self-attention), where it
    reads one. A stick-breaking scheme (`traits.normalization`) runs its own causal recurrence instead
    (stickbreaking.py; causal self-attention, no dropout).
    """
    if scheme.traits.normalization == "stickbreaking":
        if dropout.active:
            raise ValueError(f"positional scheme {scheme.name!r} (stick-breaking attention) does not implement "
                             f"attention dropout; set --config.model.attention_dropout=0")
        return stickbreaking_dense(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme, context_BxTxC)
    q_BxTxHxK, k_BxSxHxK = scheme.rotate(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
    context = None if context_BxTxC is None else (context_BxTxC, context_BxTxC)
    logits_BxHxTxS = jnp.where(mask_TxS, tile_logits(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, scheme,
                                                     context=context), NEG_INF)
    probs_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1)
    if dropout.active:
        keep = jax.random.bernoulli(dropout.key, 1.0 - dropout.rate, probs_BxHxTxS.shape)
        probs_BxHxTxS = jnp.where(keep, probs_BxHxTxS / (1.0 - dropout.rate), 0.0)
    out_BxTxHxK = jnp.einsum("bhts,bshk->bthk", probs_BxHxTxS.astype(v_BxSxHxK.dtype), v_BxSxHxK)
    value_term = scheme.value_bias(probs_BxHxTxS, q_pos_BxT, k_pos_BxS)
    if value_term is not None:
        out_BxTxHxK = out_BxTxHxK + value_term.astype(out_BxTxHxK.dtype)
    return out_BxTxHxK


def adds_value_term(scheme: Scheme, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> bool:
    """Whether the scheme's `value_bias` hook returns a term (probed on a 1 x 1 tile at trace time)."""
    probe = jnp.zeros((1, 1, 1, 1), jnp.float32)
    return scheme.value_bias(probe, q_pos_BxT[:1, :1], k_pos_BxS[:1, :1]) is not None


def padded_values(v_BxSxHxK: jax.Array, width: int) -> jax.Array:
    """v with zero features appended up to `width`, the head size of the rotated q and k, for the
    kernels that take one head size for q, k and v: a scheme's `rotate` may widen q and k (PoPE
    doubles them). The first K features of the output are the attention output, the rest zero."""
    extra = width - v_BxSxHxK.shape[-1]
    return v_BxSxHxK if extra == 0 else jnp.pad(v_BxSxHxK, [(0, 0)] * 3 + [(0, extra)])


def fused_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                    context_BxTxC: jax.Array | None = None) -> jax.Array:
    """Causal attention through `jax.nn.dot_product_attention` (cuDNN's fused kernel on GPU, an XLA
    composite elsewhere), for schemes whose positional signal is a rotation and / or an additive
    bias (a `context_bias` from the layer's input included): no `logit_scale`, no `value_bias`, no
    logit transform, softmax weights. The bias is materialised for the whole sequence."""
    traits = scheme.traits
    if (scheme.logit_scale(q_pos_BxT, k_pos_BxT) is not None or traits.needs_full_rows
            or adds_value_term(scheme, q_pos_BxT, k_pos_BxT) or traits.transforms_logits
            or traits.normalization != "softmax"):
        raise ValueError(f"positional scheme {scheme.name!r} scales or transforms logits, adds a value term, needs "
                         f"whole rows or is not a softmax; model.attention=fused cannot express it: use dense or "
                         f"blockwise")
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
