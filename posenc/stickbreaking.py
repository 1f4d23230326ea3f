"""Stick-breaking attention: attention weights that need no positional encoding."""
from __future__ import annotations


from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.options.content import StickbreakingOptions
from posenc.registry import register
from posenc.traits import Traits


@register("stickbreaking")
class StickBreaking(Scheme):
    """Stick-breaking attention in place of the softmax: with z_ij = q_i . k_j / sqrt(d) and
    beta_ij = sigmoid(z_ij), query i gives key j the share beta_ij of the stick its nearer keys left,

        A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik),    out_i = sum_j A_ij v_j + (1 - sum_j A_ij) v_i,

    (keys k <= i where `attend_current`). Nearer keys are served first, so the weights carry the
    order of the keys themselves: no positional encoding, and nothing in the weights depends on how
    long the sequence is.

    Tan, Yang, Courville, Panda & Shen, "Scaling Stick-Breaking Attention: An Efficient
    Implementation and In-depth Study", ICLR 2025 (shawntan/stickbreaking-attention:
    `stickbreaking_attention/sb_ref.py`, log-space: log sigmoid(z) plus the summed log sigmoid(-z)
    of the later keys; `attend_current=False` by default; tests/test_attn.py adds the remainder
    times the query's value). The authors' 3B model (IBM dolomite-engine) adds the remainder times a
    learned per-head vector and normalises the heads' outputs instead; not offered here.

    The weights are computed by models/attention/stickbreaking.py (read off `traits.normalization`): dense
    over whole rows, blockwise with key tiles right to left and each query's log stick carried
    (O(T x block) memory). The triangular, fused and Pallas paths, softmax kernels, refuse it; so
    do attention dropout, LM-Infinite's mask and the attention statistics.
    """
    family = "normalisation"
    citation = "Tan et al. 2025"
    extrapolates = "yes"
    Options = StickbreakingOptions
    traits = Traits(normalization="stickbreaking")

    def __init__(self, options: StickbreakingOptions, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
