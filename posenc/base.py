"""The positional-scheme interface (`Scheme`) and `build`, which instantiates the scheme a config names.

A scheme is an `nnx.Module` registered by name (posenc/registry.py). It overrides only the hooks it needs; the defaults
below are the identity (or `None`, meaning "no contribution"). Every hook takes explicit integer
positions, never "the length seen so far", so that sliding windows, offsets and interpolation are
just different position arrays. `bias` works on one (query block, key block) tile so that blockwise
attention can call it per tile without a full T x T matrix ever existing outside attention.
What the decoder and attention need to know of a scheme beyond its hooks is its `traits`
(posenc/traits.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
from flax import nnx

from posenc.kernel_bias import BiasFunction
from posenc.options.declare import NoOptions
from posenc.registry import get, options_of
from posenc.traits import Traits

__all__ = ["LengthError", "ModelDims", "NoOptions", "Scheme", "build", "check_table_length"]


@dataclasses.dataclass(frozen=True)
class ModelDims:
    """What a scheme may need to know about the model it sits in."""
    d_model: int
    num_heads: int
    head_dim: int
    num_layers: int
    train_length: int  # the training sequence length L


class LengthError(ValueError):
    """A scheme cannot evaluate at the requested length; the message names the option that fixes it."""


def check_table_length(scheme_name: str, rows: int, length: int, detail: str = "") -> None:
    """The LengthError of a scheme with a learned table of `rows` positions (option max_length)."""
    if length > rows:
        raise LengthError(
            f"positional scheme {scheme_name!r}{detail} has a table of {rows} positions but length {length} "
            f"was requested; train with --config.posenc.{scheme_name}.max_length={length} (or larger), "
            f"or evaluate at lengths <= {rows}")


class Scheme(nnx.Module):
    """Base class: every hook is a no-op. Subclasses set `Options` (the frozen dataclass of defaults
    their declaration names: posenc/options/) and `traits` where theirs are not the defaults."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""        # "absolute" | "relative" | "none" | ...
    citation: ClassVar[str] = ""
    extrapolates: ClassVar[str] = ""  # beyond the training length: yes | partly | with option | no
    Options: ClassVar[type] = NoOptions
    # What the decoder and attention read off a scheme (posenc/traits.py); an instance whose options
    # change them (or a wrapper, from what it wraps) sets its own in __init__.
    traits: ClassVar[Traits] = Traits()

    def __init__(self, options: Any, dims: ModelDims, *, rngs: nnx.Rngs):
        self.options = options
        self.dims = dims

    # --- hooks -------------------------------------------------------------------------------------
    def embed(self, x_BxTxD: jax.Array, positions_BxT: jax.Array) -> jax.Array:
        """Token embeddings -> embeddings with absolute position information."""
        return x_BxTxD

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        """Per layer, before the dot product (RoPE and its relatives)."""
        return q_BxTxHxK, k_BxSxHxK

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """Additive logits bias for one tile, broadcastable to B x H x T x S (after 1/sqrt(d))."""
        return None

    def bias_fn(self) -> BiasFunction | None:
        """The same bias as `bias`, as a function of positions that a fused kernel evaluates per tile
        (see BiasFunction); None where the scheme has no bias or does not provide one. It must equal
        `bias` (tests/models/attention/test_pallas.py checks every scheme that provides it)."""
        return None

    def value_bias(self, probs_BxHxTxS, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """A term added to the attention output, B x T x H x K, computed from the tile's probabilities."""
        return None

    def logit_scale(self, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """Multiplier of the logits, broadcastable to B x H x T x S (per query)."""
        return None

    def token_context(self, x_BxTxD: jax.Array, positions_BxT: jax.Array) -> jax.Array | None:
        """Per-token values computed once per layer from the layer's input (after its norm) and the
        positions, B x T x C, which attention slices along with q and k and hands to
        `context_bias` tile by tile; None (the default): the scheme reads no input. Computed over
        the whole sequence before any tiling, so a running sum over tokens (FoX's forget gates)
        is the same whichever tile reads it; positions increase along the sequence, as every
        attention path's causal order assumes."""
        return None

    def context_bias(self, q_ctx_BxTxC, k_ctx_BxSxC, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """Additive logits bias of one (query block, key block) tile from the `token_context`
        of its queries and keys, broadcastable to B x H x T x S (added with `bias`)."""
        return None

    def transform_logits(self, scores_BxHxTxS, bias_BxHxTxS, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """The logits of one tile from its scores (q k^T / sqrt(K), times `logit_scale`) and its
        additive bias (`bias` plus `context_bias`; None where there is none), elementwise per
        (query, key) pair; None (the default): scores + bias. Only where `traits.transforms_logits`."""
        return None

    def carried_bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, carry_BxHxT):
        """For a bias that `traits.needs_full_rows`, blockwise: the bias of one key tile given a
        per-query carry from the key tiles after it (zero before the last), and the carry extended
        by this tile: (bias, carry). Key tiles are visited right to left. Only where `traits.carries_bias`."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no carried_bias")

    def decode_refusal(self) -> str | None:
        """Why the scheme cannot generate one token at a time against a key / value cache
        (models/generation/), or None where it can: its hooks must be functions of each token, its
        position and the cached keys' positions, each key rotated once, at its own position."""
        if self.traits.normalization != "softmax":
            return (f"positional scheme {self.name!r} ({self.traits.normalization} attention) weighs the keys "
                    f"by a recurrence over the whole row; generation with a cache does not implement it")
        if self.traits.reads_input:
            return (f"positional scheme {self.name!r} reads a running sum over the layer's input (its token "
                    f"context), which the cache does not carry; generation with a cache does not implement it")
        return None

    def check_length(self, length: int) -> None:
        """Raise `LengthError` if positions 0 .. length-1 cannot be encoded."""

    def sample_positions(self, positions_BxT: jax.Array, key: jax.Array, training: bool = True) -> jax.Array:
        """The positions to run with, where `traits.samples_positions`: in training (the decoder
        calls it when it has a dropout key) and, with `training=False`, in evaluation (per window,
        with a key derived from the run's seed and the window's index). The identity by default;
        `randomized` draws a sorted random subset of a longer range."""
        return positions_BxT


def build(posenc_cfg: Any, dims: ModelDims, *, rngs: nnx.Rngs, chain: tuple[str, ...] = ()) -> Scheme:
    """Instantiate the scheme named in a `posenc` config block (ConfigDict or plain dict). A wrapper
    builds its inner scheme from the same block; `chain` names the wrappers around this one
    (outermost first), so that a chain that wraps itself is refused."""
    cls = get(posenc_cfg["name"])
    options = options_of(posenc_cfg)
    if cls.traits.wrapper:
        return cls(options, dims, rngs=rngs, posenc_cfg=posenc_cfg, chain=chain)
    return cls(options, dims, rngs=rngs)
