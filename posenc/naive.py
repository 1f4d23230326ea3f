"""Naive absolute encodings, ablation baselines: the position as a number or as binary digits.

A value added to every feature would be invisible: each pre-LayerNorm subtracts the mean over the
features, so x + p * ones is normalised exactly like x. The integer and normalised encodings are
therefore added to one feature (the first), and the binary digits to the first `max_bits`.
Kazemnejad, "Transformer Architecture: The Positional Encoding" (blog, 2019) discusses all three
as the candidates that motivate sinusoids.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from posenc.base import LengthError, ModelDims, Scheme
from posenc.options.absolute import BinaryOptions, NormalizedOptions
from posenc.registry import register


def add_to_first_features(x_BxTxD: jax.Array, values_BxTxF: jax.Array) -> jax.Array:
    """x with values added to its first F features."""
    f = values_BxTxF.shape[-1]
    return x_BxTxD.at[..., :f].add(values_BxTxF.astype(x_BxTxD.dtype))


@register("integer")
class Integer(Scheme):
    """The raw index: x_p <- x_p + p e_0 (p added to the first feature only; see the module doc).

    Unbounded: positions beyond the training length give values never seen in training, and large
    p dominates the LayerNorm of its token. Ablation baseline (Kazemnejad 2019, blog).
    """
    family = "absolute"
    citation = "Kazemnejad 2019 (blog)"
    extrapolates = "no"

    def embed(self, x_BxTxD, positions_BxT):
        return add_to_first_features(x_BxTxD, positions_BxT.astype(jnp.float32)[..., None])


@register("normalized")
class Normalized(Scheme):
    """The position scaled to [0, 1]: x_p <- x_p + (p / (T - 1)) e_0 (first feature only).

    With denominator="row", T - 1 is the largest position in that row of `positions`, the
    textbook definition: NOT length-invariant, the same position gets a different value in a longer
    window, so a prefix is encoded differently from the same tokens inside a longer sequence (the
    prefix-consistency property of tests/models/test_decoder.py fails by construction), and it violates
    the interface rule that hooks depend on positions, not on the length seen. The default
    denominator="train_length" uses T = L_train instead. Training windows are always positions
    0 .. L_train - 1, so training is identical under both; they differ only at evaluation, where
    "row" squeezes a longer window into [0, 1] and "train_length" gives values above 1 past L_train.
    Switch at evaluation with --config.posenc.normalized.denominator=row. Ablation baseline
    (Kazemnejad 2019, blog).
    """
    family = "absolute"
    citation = "Kazemnejad 2019 (blog)"
    extrapolates = "no"
    Options = NormalizedOptions

    def __init__(self, options, dims: ModelDims, *, rngs):
        super().__init__(options, dims, rngs=rngs)
        if options.denominator not in ("train_length", "row"):
            raise ValueError(f"normalized.denominator must be 'train_length' or 'row', "
                             f"got {options.denominator!r}")

    def embed(self, x_BxTxD, positions_BxT):
        p = positions_BxT.astype(jnp.float32)
        if self.options.denominator == "row":
            last_Bx1 = jnp.max(p, axis=-1, keepdims=True)
        else:
            last_Bx1 = jnp.full((p.shape[0], 1), self.dims.train_length - 1, jnp.float32)
        return add_to_first_features(x_BxTxD, (p / jnp.maximum(last_Bx1, 1.0))[..., None])


def binary_digits(positions: jax.Array, num_bits: int) -> jax.Array:
    """Bit k of p (least significant first) as -1 (0) or +1 (1): positions.shape + (num_bits,)."""
    bits = (positions.astype(jnp.int32)[..., None] >> jnp.arange(num_bits, dtype=jnp.int32)) & 1
    return 2.0 * bits.astype(jnp.float32) - 1.0


@register("binary")
class Binary(Scheme):
    """Binary digits of the position: x_p <- x_p + sum_k (2 b_k(p) - 1) e_k, k < max_bits.

    b_k(p) = floor(p / 2^k) mod 2, least significant digit on feature 0; every position uses all
    max_bits features (high digits of small positions are -1), so the code of p never depends on
    the window. Positions >= 2**max_bits cannot be written (LengthError). Digits above
    log2(L_train) are constant (-1) in training and first flip beyond it. Ablation baseline
    (Kazemnejad 2019, blog).
    """
    family = "absolute"
    citation = "Kazemnejad 2019 (blog)"
    extrapolates = "no"
    Options = BinaryOptions

    def __init__(self, options, dims: ModelDims, *, rngs):
        super().__init__(options, dims, rngs=rngs)
        if not 1 <= options.max_bits <= min(dims.d_model, 30):
            raise ValueError(f"binary.max_bits must lie in [1, min(d_model, 30)] = "
                             f"[1, {min(dims.d_model, 30)}], got {options.max_bits}")

    def embed(self, x_BxTxD, positions_BxT):
        return add_to_first_features(x_BxTxD, binary_digits(positions_BxT, self.options.max_bits))

    def check_length(self, length):
        limit = 2 ** self.options.max_bits
        if length > limit:
            need = max(1, math.ceil(math.log2(length)))
            raise LengthError(
                f"positional scheme 'binary' writes {self.options.max_bits} binary digits, i.e. "
                f"{limit} positions, but length {length} was requested; train with "
                f"--config.posenc.binary.max_bits={need} (or larger), or evaluate at lengths <= {limit}")
