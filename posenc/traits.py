"""What the decoder and the attention paths read off a positional scheme, in one frozen value.

A scheme declares its `Traits` once (a class default; where options change them, the instance
computes them from its options); a wrapper takes its inner scheme's and changes what it changes.
The traits say everything an attention path needs to decide whether it can run a scheme, from the
traits and the sequence's shape alone, without calling a hook at trace time: tests/posenc/
test_traits.py probes every scheme's hooks and checks that they agree with its traits.

No JAX here, so that config code can read them.
"""
from __future__ import annotations

import dataclasses

NORMALIZATIONS = ("softmax", "stickbreaking")
LOGIT_SCALES = ("none", "per_query", "per_pair")
BIASES = ("none", "function", "tile")


@dataclasses.dataclass(frozen=True)
class Traits:
    """One scheme's traits (the defaults: a scheme that needs nothing of attention but its hooks).

    - per_layer: one instance per layer rather than one shared by every layer.
    - needs_full_rows: a tile's bias depends on keys outside the tile (CoPE); blockwise attention
      then needs `carried_bias` (`carries_bias`).
    - carries_bias: `carried_bias` is implemented.
    - bias_work_per_key: `bias` does work per key that row tiles would repeat for each key prefix
      (`auto` trains such a scheme with dense attention).
    - samples_positions: `sample_positions` draws random positions.
    - reads_input: `token_context` reads the layer's input (FoX): a bias no kernel can compute
      from positions alone.
    - transforms_logits: `transform_logits` is not scores + bias (DAPE).
    - normalization: how logits become attention weights, "softmax" or "stickbreaking"
      (models/attention/stickbreaking.py).
    - wrapper: the scheme wraps another (its option `base`), whose hooks it delegates to.
    - value_term: `value_bias` returns a term added to the attention output (Shaw's).
    - rotates_per_head: `rotate` turns a key differently for each query head (FoPE's coefficients per
      head), so grouped-query keys cannot be shared by their group after rotation.
    - logit_scale: what `logit_scale` returns: "none", "per_query" (a scalar, or one factor per
      query: broadcastable to B x H x T x 1) or "per_pair" (one factor per query and key).
    - bias: the additive bias: "none"; "function" (`bias`, and the same as `bias_fn()`, a
      function of positions a kernel evaluates per tile: posenc/kernel_bias.py); "tile" (only
      the `bias` hook, computed by attention tile by tile).
    - moves_positions: the "tile" bias is the logit at other positions minus the plain one (ReRoPE,
      Self-Extend, DCA), also given as `position_variants` (q and k rotated on per move, and the
      rule that picks one per pair) for a kernel that computes each pair's logit once.
    """
    per_layer: bool = False
    needs_full_rows: bool = False
    carries_bias: bool = False
    bias_work_per_key: bool = False
    samples_positions: bool = False
    reads_input: bool = False
    transforms_logits: bool = False
    normalization: str = "softmax"
    wrapper: bool = False
    value_term: bool = False
    rotates_per_head: bool = False
    logit_scale: str = "none"
    bias: str = "none"
    moves_positions: bool = False

    def __post_init__(self):
        for name, valid in (("normalization", NORMALIZATIONS), ("logit_scale", LOGIT_SCALES), ("bias", BIASES)):
            if getattr(self, name) not in valid:
                raise ValueError(f"Traits.{name} must be one of {', '.join(valid)}, got {getattr(self, name)!r}")
        if self.moves_positions and self.bias != "tile":
            raise ValueError("Traits.moves_positions describes a tile bias: set bias='tile' too")
        if self.carries_bias and not self.needs_full_rows:
            raise ValueError("Traits.carries_bias is for a bias that needs full rows: set needs_full_rows too")

    def replace(self, **changes) -> "Traits":
        """A copy with `changes` (what a wrapper or an option changes)."""
        return dataclasses.replace(self, **changes)

    @property
    def needs_whole_rows(self) -> bool:
        """The bias needs all keys of a row at once and cannot carry them across key tiles."""
        return self.needs_full_rows and not self.carries_bias
