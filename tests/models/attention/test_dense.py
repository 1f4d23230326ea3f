"""The fused path (fused.py: jax.nn.dot_product_attention) against dense attention."""
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


@pytest.mark.parametrize("name", posenc.names())
def test_fused_attention_equals_dense_or_refuses_clearly(name):
    """jax.nn.dot_product_attention (cuDNN on GPU; the XLA composite on this CPU) for the schemes it
    can express: a rotation and / or an additive bias."""
    base = {**CFG.__dict__, "num_layers": 1}
    dense = DecoderLM(ModelConfig(**{**base, "attention": "dense"}), posenc.default_config(name),
                      train_length=64, rngs=nnx.Rngs(0))
    fused = DecoderLM(ModelConfig(**{**base, "attention": "fused"}), posenc.default_config(name),
                      train_length=64, rngs=nnx.Rngs(0))
    x = tokens(4, t=24)
    try:
        out = fused(x)
    except ValueError as e:
        assert "model.attention=fused cannot express it" in str(e)
        return
    np.testing.assert_allclose(out, dense(x), atol=1e-5, rtol=1e-5)
