"""PoSE against a transcription of the authors' `train_preprocess_function_pose` (dwzhu-pku/PoSE,
src/train_pose.py), its position part, written out here in Python."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc
from posenc.pose import pose_positions, sample_chunks
from tests.posenc.helpers import DIMS, build_with as build, positions


def reference_pose_position_ids(len_chunk, rt1, rt, lt1=0, lt=0):
    """The reference's position ids for one example of len_chunk tokens, given its draws rt1 (the
    first chunk's end, randint(1, (len_chunk + 1) // 2)) and rt (the second chunk's skip,
    randint(lt, scaled_max_position_embeddings - len_pos_ids)); lt = 0 in the reference."""
    pos_ids = list(range(len_chunk))
    for i in range(len_chunk):
        pos_ids[i] += lt if i < rt1 - lt1 else rt
    return pos_ids


def test_pose_positions_equal_the_reference_for_every_draw():
    t, target = 9, 40
    for rt1 in range(1, (t + 1) // 2 + 1):
        for rt in (0, 1, 17, target - t):
            got = pose_positions(positions(1, t), jnp.array([rt1]), jnp.array([rt]))[0]
            assert got.tolist() == reference_pose_position_ids(t, rt1, rt)


def test_pose_draws_cover_the_references_ranges_and_stay_below_the_target():
    t, target = 9, 40
    first, skip = (np.asarray(a) for a in sample_chunks(jax.random.key(0), 4000, t, target))
    assert set(first.tolist()) == set(range(1, (t + 1) // 2 + 1))  # randint(1, (T + 1) // 2), both ends
    assert set(skip.tolist()) == set(range(0, target - t + 1))      # randint(0, L_t - T), both ends
    scheme = build("pose", pose__target_length=target)
    sampled = np.asarray(scheme.sample_positions(positions(64, t), jax.random.key(1)))
    assert (np.diff(sampled, axis=-1) > 0).all() and sampled.min() == 0 and sampled.max() <= target - 1
    assert len({tuple(row) for row in sampled}) > 10  # a draw per row
    np.testing.assert_array_equal(scheme.sample_positions(positions(2, t), jax.random.key(1), training=False),
                                  positions(2, t))  # evaluation: the positions as given


def test_pose_asks_its_inner_scheme_for_the_target_length_and_refuses_a_shorter_one():
    assert build("pose").target_length == 16 * DIMS.train_length
    scheme = build("pose", pose__base="learned", pose__target_length=64)
    with pytest.raises(posenc.LengthError, match="learned.max_length=64"):
        scheme.check_length(16)
    build("pose", pose__base="learned", pose__target_length=64, learned__max_length=64).check_length(16)
    with pytest.raises(ValueError, match="pose.target_length"):
        build("pose", pose__target_length=8)  # below the training length, 16
