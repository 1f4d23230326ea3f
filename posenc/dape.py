"""DAPE: the positional bias refined, per (query, key) pair, by a small MLP over the heads that also
sees the attention scores."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from posenc import pair_mlp
from posenc.base import ModelDims
from posenc.fire import _torch_linear_init
from posenc.options.wrappers import DapeOptions
from posenc.registry import register
from posenc.traits import Traits
from posenc.wrappers import Wrapper

LEAKY_SLOPE = 0.01  # PyTorch's nn.LeakyReLU default, the reference's activation


@register("dape")
class Dape(Wrapper):
    """Data-Adaptive Positional Encoding around any scheme: with S = q k^T / sqrt(d) the scores of a
    pair (all heads) and B its base bias (the wrapped scheme's, all heads),

        logits = S + B + f([S, B]),    f(u) = W2 LeakyReLU(W1 u + b1) + b2,    u in R^(2H), f(u) in R^H,

    one MLP per layer applied to every (query, key) pair, mixing heads: the bias adapts to the
    content and to the attention pattern at each length.

    Zheng, Gao, Shi, Huang, Li, Xiong, Ren, Ng, Jiang, Li & Li, "DAPE: Data-Adaptive Positional
    Encoding for Length Extrapolation", NeurIPS 2024 (chuanyang-Zheng/DAPE: `AliBi_C`,
    `ParallelKerpleLog_C`, `FIRE_C` in megatron/model/positional_embeddings.py; `mlp_width` 32,
    `nn.Linear` layers with PyTorch's default initialisation, LeakyReLU). The base bias is this
    registry's scheme with its own options and initialisation, one per layer (the reference's
    KERPLE and FIRE are per layer too); the reference's FIRE_C uses LeakyReLU inside FIRE's own
    MLP, ours (`fire`) the FIRE authors' ReLU.

    Hook: `transform_logits`, elementwise per pair, so blockwise evaluation applies it tile by tile
    (its hidden layer within pair_mlp's budget: no unbounded B x tile x hidden array). The triangular, fused
    and Pallas paths, which add a bias and nothing else, refuse it.
    """
    family = "wrapper"
    citation = "Zheng et al. 2024"
    extrapolates = "yes"
    Options = DapeOptions
    traits = Traits(wrapper=True, per_layer=True, transforms_logits=True)  # whatever the base: one MLP per layer

    def __init__(self, options: DapeOptions, dims: ModelDims, *, rngs: nnx.Rngs, posenc_cfg: Any = None,
                 chain: tuple[str, ...] = ()):
        super().__init__(options, dims, rngs=rngs, posenc_cfg=posenc_cfg, chain=chain)
        if self.inner.traits.transforms_logits or self.inner.traits.normalization != "softmax":
            raise ValueError(f"dape cannot wrap {options.base!r}: it already transforms logits or is not a softmax")
        h, width = dims.num_heads, options.hidden
        self.w1 = nnx.Param(_torch_linear_init(rngs.params(), 2 * h, (2 * h, width)))
        self.b1 = nnx.Param(_torch_linear_init(rngs.params(), 2 * h, (width,)))
        self.w2 = nnx.Param(_torch_linear_init(rngs.params(), width, (width, h)))
        self.b2 = nnx.Param(_torch_linear_init(rngs.params(), width, (h,)))

    def refinement(self, scores_BxHxTxS: jax.Array, bias_BxHxTxS: jax.Array) -> jax.Array:
        """f([S, B]), B x H x T x S (`refine`)."""
        return refine(scores_BxHxTxS, bias_BxHxTxS, self.w1[...], self.b1[...], self.w2[...], self.b2[...])

    def traits_around(self, inner: Traits) -> Traits:
        """The base's bias reaches the logits only through `transform_logits`: never as a function
        a kernel adds alone (`bias_fn` is None)."""
        return super().traits_around(inner).replace(bias="none" if inner.bias == "none" else "tile")

    def bias_fn(self):
        return None  # a kernel that adds the base bias alone would miss the refinement

    def transform_logits(self, scores_BxHxTxS, bias_BxHxTxS, q_pos_BxT, k_pos_BxS):
        if bias_BxHxTxS is None:  # the MLP still sees a bias of zeros (one value per head, broadcast)
            return scores_BxHxTxS + self.refinement(scores_BxHxTxS, jnp.zeros((1, scores_BxHxTxS.shape[1], 1, 1)))
        bias = bias_BxHxTxS.astype(jnp.float32)
        return scores_BxHxTxS + bias + self.refinement(scores_BxHxTxS, bias)


@jax.jit
def refine(scores_BxHxTxS, bias_BxHxTxS, w1_2HxW, b1_W, w2_WxH, b2_H):
    """W2 LeakyReLU(W1 [S, B] + b1) + b2 for every pair, B x H x T x S, as matrix products over the
    heads and the hidden units (posenc/pair_mlp.py: activations recomputed for the backward pass, and
    no hidden-layer array above its budget). The bias enters at its own shape (one row where it is
    shared), so its product is computed once. Jitted, so that an eager call compiles it once per shape."""
    h = scores_BxHxTxS.shape[1]
    return pair_mlp.apply((scores_BxHxTxS, bias_BxHxTxS), (w1_2HxW[:h], w1_2HxW[h:]), b1_W, w2_WxH,
                          lambda x: jax.nn.leaky_relu(x, LEAKY_SLOPE)) + b2_H[:, None, None]
