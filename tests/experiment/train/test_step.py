"""The jitted update: micro-steps accumulated inside one step equal the one-shot update, per-row
dropout keys, the dropout PRNG option."""

import jax
import numpy as np
import pytest

from experiment.config import ConfigError
from experiment.train import step as step_lib
from tests.conftest import tiny_config
from tests.helpers import one_update


def test_micro_steps_are_the_fewest_that_fit_each_devices_share():
    assert step_lib.micro_batching(144, 512, 9216, 1) == 8   # the paper's update on one device
    assert step_lib.micro_batching(144, 512, 9216, 2) == 4
    assert step_lib.micro_batching(144, 512, 9216, 8) == 1   # the paper's 8 GPUs
    assert step_lib.micro_batching(144, 512, 9216, 3) == 3   # 48 rows per device: 3 x 16
    assert step_lib.micro_batching(144, 512, 0, 1) == 1      # no cap
    assert step_lib.micro_batching(10, 16, 48, 1) == 5       # 3 rows fit; 10 rows -> 5 x 2
    with pytest.raises(ConfigError, match="device_batch_tokens"):
        step_lib.micro_batching(8, 512, 100, 1)
    with pytest.raises(ConfigError, match="multiple of 8"):
        step_lib.micro_batching(12, 16, 0, 8)


def test_dropout_rng_option_is_reproducible_and_defaults_to_threefry():
    """train.dropout_rng picks the dropout keys' PRNG; a config without it (runs saved before the
    option) draws the masks it always did."""
    config = tiny_config("alibi")
    config.model.update(dict(dropout=0.3))
    config.train.update(dict(batch_size=2, optimizer="nag", momentum=0.9, lr=0.5, warmup_steps=0))
    legacy, _ = one_update(config, 1)
    config.train.dropout_rng = "threefry"
    threefry, _ = one_update(config, 1)
    config.train.dropout_rng = "rbg"
    rbg, _ = one_update(config, 1)
    rbg_again, _ = one_update(config, 1)
    leaves = lambda p: [np.asarray(x) for x in jax.tree.leaves(p)]
    for a, b, c, d in zip(leaves(legacy), leaves(threefry), leaves(rbg), leaves(rbg_again)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, d)
    assert any(not np.array_equal(a, c) for a, c in zip(leaves(threefry), leaves(rbg)))
    with pytest.raises(ConfigError, match="dropout_rng"):
        step_lib.make_train_step(None, None, 0, rng_impl="philox")


@pytest.mark.parametrize("dropout,k", [pytest.param(0.0, 2, marks=pytest.mark.slow), (0.3, 8)])  # 8: one sequence per micro-step
def test_accumulated_update_equals_the_one_shot_update(dropout, k):
    config = tiny_config("alibi")
    config.model.update(dict(dropout=dropout, attention_dropout=dropout / 3, activation_dropout=dropout / 3))
    # NAG, the paper's optimizer: Adam's first step is g / |g| per weight, which turns the rounding noise
    # of gradients that are exactly zero in exact arithmetic (the key bias) into full-size steps.
    config.train.update(dict(batch_size=8, optimizer="nag", momentum=0.99, lr=0.5, warmup_steps=0,
                             grad_clip=0.05))  # clipping active
    whole, m1 = one_update(config, 1)
    split, mk = one_update(config, k)
    np.testing.assert_allclose(mk["loss"], m1["loss"], rtol=1e-5)
    np.testing.assert_allclose(mk["grad_norm"], m1["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(split), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    if dropout:  # the masks really are drawn: without dropout the loss differs
        config.model.update(dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0))
        assert abs(one_update(config, 1)[1]["loss"] - m1["loss"]) > 1e-3


@pytest.mark.slow  # the dropout case of test_accumulated_update_equals_the_one_shot_update covers per-row keys
def test_randomized_positions_are_drawn_per_row():
    config = tiny_config("randomized")
    config.train.update(dict(batch_size=4, warmup_steps=0, optimizer="nag", momentum=0.9, lr=0.1))
    (whole, m1), (split, m2) = one_update(config, 1), one_update(config, 4)
    np.testing.assert_allclose(m2["loss"], m1["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(split), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
