"""KERPLE (log, power) against its formulas on hand-computed cases; with FIRE, the learned biases'
gradients and which of them are shared by all layers."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.config import ModelConfig
from posenc.kerple import inverse_sigmoid, inverse_softplus
from tests.posenc.helpers import POS, build_bias as build, set_param


def test_kerple_log_formula():
    scheme = build("kerple_log")
    set_param(scheme.r1_raw, inverse_softplus(jnp.array([2.0, 0.5])))
    set_param(scheme.r2_raw, inverse_softplus(jnp.array([0.5, 3.0])))
    bias = np.asarray(scheme.bias(None, None, POS, POS))[0]
    assert bias[0, 4, 1] == pytest.approx(-2.0 * math.log(2.5), rel=1e-5)  # |4 - 1| = 3
    assert bias[1, 7, 0] == pytest.approx(-0.5 * math.log(22.0), rel=1e-5)
    assert bias[0, 3, 3] == 0.0
    assert bias[0, 1, 4] == bias[0, 4, 1]  # |i - j|


def test_kerple_power_formula_and_range():
    scheme = build("kerple_power")
    set_param(scheme.r1_raw, inverse_softplus(jnp.array([0.5, 1.0])))
    set_param(scheme.r2_raw, inverse_sigmoid(jnp.array([1.5, 0.5]) / 2))
    bias = np.asarray(scheme.bias(None, None, POS, POS))[0]
    assert bias[0, 5, 1] == pytest.approx(-0.5 * 4 ** 1.5, rel=1e-5)  # = -4
    assert bias[1, 6, 2] == pytest.approx(-1.0 * 4 ** 0.5, rel=1e-5)
    assert bias[1, 2, 2] == 0.0
    r1, r2 = build("kerple_power", heads=16).coefficients()
    assert (r1 > 0).all() and (r2 > 0).all() and (r2 <= 2).all()


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power", "fire"])
def test_learned_bias_gradients_are_finite(name):
    scheme = build(name)
    params = nnx.state(scheme, nnx.Param)
    graphdef = nnx.graphdef(scheme)

    def loss(params):
        merged = nnx.merge(graphdef, params)
        return jnp.sum(merged.bias(None, None, POS, POS) ** 2)  # includes distance 0 and j > i

    grads = jax.grad(loss)(params)
    leaves = jax.tree.leaves(grads)
    assert leaves and all(np.isfinite(g).all() for g in leaves)
    assert any(np.abs(g).sum() > 0 for g in leaves)


def test_per_layer_parameters_and_no_length_limit():
    cfg = ModelConfig(vocab_size=11, num_layers=2, d_model=16, num_heads=2, mlp_dim=32)
    far = jnp.array([[0, 5, 1000, 100_000]])
    for name, shared in (("kerple_log", True), ("kerple_power", True), ("fire", False)):
        model = DecoderLM(cfg, posenc.default_config(name), train_length=8, rngs=nnx.Rngs(0))
        # KERPLE: one (r1, r2) for the stack, as the authors' code; per layer on request
        assert (model.blocks[0].attn.scheme is model.blocks[1].attn.scheme) == shared
        if shared:
            per_layer = posenc.default_config(name)
            per_layer[name].per_layer = True
            split = DecoderLM(cfg, per_layer, train_length=8, rngs=nnx.Rngs(0))
            assert split.blocks[0].attn.scheme is not split.blocks[1].attn.scheme
        model.scheme.check_length(10 ** 6)
        assert np.isfinite(model.blocks[0].attn.scheme.bias(None, None, far, far)).all()
