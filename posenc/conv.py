"""Convolutional position information: a causal convolution over the embeddings, nothing else.

Position is never given to the model; it leaks only through the zero padding at the start of the
sequence, as Islam et al. (2020) found for CNNs and Chu et al. (2021) used for vision Transformers.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.options.absolute import ConvOptions
from posenc.registry import register


def causal_conv(x_BxTxD: jax.Array, kernel: jax.Array) -> jax.Array:
    """y_t = sum_{k=0}^{K-1} W_k x_{t-k}, x_{t<0} = 0 (zero left padding), so y_t sees no future token.

    `kernel` is K x D (depthwise: W_k a diagonal) or K x D x D (full: W_k a matrix, y = x W_k);
    kernel[0] weighs the current token, kernel[k] the token k steps back.
    """
    k_size, t = kernel.shape[0], x_BxTxD.shape[1]
    padded = jnp.pad(x_BxTxD, [(0, 0), (k_size - 1, 0), (0, 0)])
    y = jnp.zeros(x_BxTxD.shape, jnp.float32)
    for k in range(k_size):  # K is small and static: K shifted slices, no T x T or T x K x D tensor
        shifted = jax.lax.dynamic_slice_in_dim(padded, k_size - 1 - k, t, axis=1).astype(jnp.float32)
        if kernel.ndim == 2:
            y = y + shifted * kernel[k]
        else:
            y = y + jnp.einsum("btd,de->bte", shifted, kernel[k])
    return y


@register("conv")
class CausalConv(Scheme):
    """A causal 1-D convolution of the token embeddings before the first layer, added residually:

        x'_t = x_t + sum_{k=0}^{K-1} W_k x_{t-k},  x_{t<0} = 0.

    No position vector exists: only the first K-1 tokens can tell where they are (their window
    reaches into the zero padding); beyond them the causal mask is the only source of order, as
    in NoPE. The positional-encoding generator (PEG) of Chu et al., "Conditional Positional
    Encodings for Vision Transformers" (ICLR 2023, arXiv 2021), made causal and one-dimensional;
    zero padding as a position signal: Islam et al., "How Much Position Information Do
    Convolutional Neural Networks Encode?" (ICLR 2020). Kernel size 3 is PEG's (3 x 3) choice.
    The positions passed in are ignored, so a window that starts at an offset is treated as the
    start of a sequence. Extends to any length.
    """
    family = "convolutional"
    citation = "Chu et al. 2021; Islam et al. 2020"
    extrapolates = "yes"
    Options = ConvOptions

    def __init__(self, options: ConvOptions, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if options.kernel_size < 1:
            raise ValueError(f"conv.kernel_size must be >= 1, got {options.kernel_size}")
        k, d = options.kernel_size, dims.d_model
        shape = (k, d) if options.depthwise else (k, d, d)
        fan_in = k if options.depthwise else k * d
        self.kernel = nnx.Param(nnx.initializers.normal(stddev=fan_in ** -0.5)(rngs.params(), shape, jnp.float32))

    def decode_refusal(self):
        return (f"positional scheme 'conv' convolves each token's embedding with the previous "
                f"{self.options.kernel_size - 1}, which the cache does not keep; generation with a cache does not "
                f"implement it")

    def embed(self, x_BxTxD, positions_BxT):
        return x_BxTxD + causal_conv(x_BxTxD, self.kernel[...]).astype(x_BxTxD.dtype)
