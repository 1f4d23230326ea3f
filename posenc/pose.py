"""PoSE: positional skip-wise training, a target length simulated inside the training window."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import ModelDims
from posenc.options.wrappers import PoseOptions
from posenc.registry import register
from posenc.traits import Traits
from posenc.wrappers import Wrapper


def pose_positions(positions_BxT: jax.Array, first_chunk_B: jax.Array, skip_B: jax.Array) -> jax.Array:
    """The window cut after its first `first_chunk` tokens, the second chunk's positions moved on by
    `skip` (per row): positions + skip where the index >= first_chunk."""
    index_1xT = jnp.arange(positions_BxT.shape[1])[None]
    moved = jnp.where(index_1xT >= first_chunk_B[:, None], skip_B[:, None], 0)
    return positions_BxT + moved.astype(positions_BxT.dtype)


def sample_chunks(key: jax.Array, batch: int, length: int, target_length: int) -> tuple[jax.Array, jax.Array]:
    """Per row, (first chunk length, skip): the first chunk uniform on 1 .. ceil(T/2) tokens and the
    skip uniform on 0 .. L_t - T, both ends included (the reference's `random.randint` calls), so
    the last position is at most L_t - 1."""
    k_first, k_skip = jax.random.split(key)
    first_B = jax.random.randint(k_first, (batch,), 1, (length + 1) // 2 + 1)
    skip_B = jax.random.randint(k_skip, (batch,), 0, max(target_length - length, 0) + 1)
    return first_B, skip_B


@register("pose")
class Pose(Wrapper):
    """Positional skip-wise training around any scheme that takes positions: each training window
    of T tokens is cut in two chunks, the first of 1 .. ceil(T/2) tokens at positions 0, 1, ...,
    and the second continuing at its own index plus a skip u drawn on 0 .. L_t - T, per row and
    step. Relative distances up to L_t - 1 are then trained inside windows of T tokens, while
    each chunk keeps consecutive positions. Evaluation uses the positions 0 .. T-1 as given.

    Zhu, Yang, Wang, Song, Wu, Wei & Li, "PoSE: Efficient Context Window Extension of LLMs via
    Positional Skip-wise Training", ICLR 2024. Ported from the authors' `train_preprocess_function_pose`
    (dwzhu-pku/PoSE, src/train_pose.py): two chunks, the first chunk's length uniform on
    1 .. (T + 1) // 2 and its skip 0, the second's skip uniform on 0 .. L_t - T. The reference
    also takes the second chunk's tokens from further on in a longer document (up to 5 L tokens,
    so that content skips too); here the tokens stay the training window of the data pipeline
    and only positions skip. Our default L_t = 16 x train_length matches the longest evaluation
    multiplier of the demo sweep. The inner scheme must encode positions up to L_t - 1
    (`check_length` asks it for max(length, L_t)).
    """
    family = "wrapper"
    citation = "Zhu et al. 2024"
    extrapolates = "with option"  # to target_length (a training-time choice)
    Options = PoseOptions
    traits = Traits(wrapper=True, samples_positions=True)

    def __init__(self, options: PoseOptions, dims: ModelDims, *, rngs: nnx.Rngs, posenc_cfg: Any = None,
                 chain: tuple[str, ...] = ()):
        if options.target_length < 0 or 0 < options.target_length < dims.train_length:
            raise ValueError(f"pose.target_length is the length simulated in training: at least the training "
                             f"length {dims.train_length} (0 = 16 x train_length), got {options.target_length}")
        super().__init__(options, dims, rngs=rngs, posenc_cfg=posenc_cfg, chain=chain)
        self.target_length = options.target_length or 16 * dims.train_length

    def check_length(self, length):
        self.inner.check_length(max(length, self.target_length))

    def sample_positions(self, positions_BxT, key, training=True):
        if training:
            first_B, skip_B = sample_chunks(key, *positions_BxT.shape, self.target_length)
            positions_BxT = pose_positions(positions_BxT, first_B, skip_B)
        return self.inner.sample_positions(positions_BxT, jax.random.fold_in(key, 1), training)
