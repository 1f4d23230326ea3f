"""Blockwise attention (tiles with an online softmax) against dense attention, through the decoder:
values for every scheme, gradients for a fixed, a learned and a carried bias."""
import jax
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.config import ModelConfig

CFG = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64)


def tokens(seed=0, t=12):
    return jax.random.randint(jax.random.key(seed), (2, t), 0, CFG.vocab_size)


def _dense_and_tiled(name, num_layers=1):
    base = {**CFG.__dict__, "num_layers": num_layers}
    dense = DecoderLM(ModelConfig(**{**base, "attention": "dense"}), posenc.default_config(name),
                      train_length=64, rngs=nnx.Rngs(0))
    tiled = DecoderLM(ModelConfig(**{**base, "attention": "blockwise", "attention_block": 16}),
                      posenc.default_config(name), train_length=64, rngs=nnx.Rngs(0))
    return dense, tiled


@pytest.mark.parametrize("name", posenc.names())
def test_blockwise_attention_equals_dense(name):
    """Same parameters, two attention paths: tiles of 16 over 40 tokens (padding, skipped tiles);
    cope's whole-row bias goes through `carried_bias`, key tiles right to left."""
    dense, tiled = _dense_and_tiled(name)
    x = tokens(3, t=40)
    np.testing.assert_allclose(tiled(x), dense(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "t5", "cope"])
def test_blockwise_attention_gradients_equal_dense(name):
    dense, tiled = _dense_and_tiled(name)
    x = tokens(3, t=40)
    grads = [jax.jit(jax.grad(lambda m: m.token_nll(x, x).mean()))(m) for m in (dense, tiled)]
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
