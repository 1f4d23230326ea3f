"""Properties every scheme must give the decoder (causality, prefix consistency, tile-wise bias), its
dropout, its config and how it is built."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM, ModelConfig

CFG = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64)
T = 12


def make_model(name):
    return DecoderLM(CFG, posenc.default_config(name), train_length=16, rngs=nnx.Rngs(0))


def tokens(seed=0, t=T):
    return jax.random.randint(jax.random.key(seed), (2, t), 0, CFG.vocab_size)


@pytest.mark.parametrize("name", posenc.names())
def test_causality(name):
    model = make_model(name)
    x = tokens()
    base = model(x)
    for t in (0, 5, T - 2):
        changed = x.at[:, t + 1:].set((x[:, t + 1:] + 7) % CFG.vocab_size)
        out = model(changed)
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-5, rtol=1e-5)
        assert not np.allclose(out[:, t + 1:], base[:, t + 1:], atol=1e-4)


@pytest.mark.parametrize("name", posenc.names())
def test_prefix_consistency(name):
    model = make_model(name)
    x = tokens(1)
    full = model(x)
    for n in (1, 4, T - 1):
        np.testing.assert_allclose(model(x[:, :n]), full[:, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", posenc.names())
def test_bias_of_a_tile_equals_that_block_of_the_full_bias(name):
    dims = posenc.ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=2, train_length=16)
    scheme = posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))
    q = jax.random.normal(jax.random.key(0), (2, T, 4, 8))
    k = jax.random.normal(jax.random.key(1), (2, T, 4, 8))
    pos = jnp.broadcast_to(jnp.arange(T), (2, T))
    if getattr(posenc.get(name), "needs_full_rows", False):
        pytest.skip(f"{name}'s bias of a tile needs the keys outside the tile (needs_full_rows)")
    full = scheme.bias(q, k, pos, pos)
    if full is None:
        pytest.skip(f"{name} has no bias hook")
    tile = scheme.bias(q[:, 4:8], k[:, 2:6], pos[:, 4:8], pos[:, 2:6])
    np.testing.assert_allclose(np.broadcast_to(full, (2, 4, T, T))[:, :, 4:8, 2:6],
                               np.broadcast_to(tile, (2, 4, 4, 4)), atol=1e-6)


def test_dropout_only_with_a_key():
    cfg = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64,
                      dropout=0.3, attention_dropout=0.1, activation_dropout=0.1)
    model = DecoderLM(cfg, posenc.default_config("alibi"), train_length=16, rngs=nnx.Rngs(0))
    x = tokens()
    np.testing.assert_array_equal(model(x), model(x))
    a, b = model(x, dropout_key=jax.random.key(1)), model(x, dropout_key=jax.random.key(2))
    assert not np.allclose(a, b)


def test_model_config_errors_are_clear():
    with pytest.raises(ValueError, match="not divisible"):
        ModelConfig.from_config({"d_model": 30, "num_heads": 4}, 10)
    with pytest.raises(ValueError, match="unknown model option"):
        ModelConfig.from_config({"d_modle": 32}, 10)


def test_untied_output_has_its_own_projection():
    cfg = ModelConfig(vocab_size=37, num_layers=1, d_model=32, num_heads=4, mlp_dim=64, tie_embeddings=False)
    model = DecoderLM(cfg, posenc.default_config("nope"), train_length=16, rngs=nnx.Rngs(0))
    assert model(tokens()).shape == (2, T, 37)
    assert hasattr(model, "unembed")


def test_model_config_can_exist_before_the_vocabulary():
    import dataclasses
    assert dataclasses.fields(ModelConfig)[0].name == "vocab_size" and ModelConfig().vocab_size == 0
    assert ModelConfig.from_config({"d_model": 32}, 10).vocab_size == 10


def test_build_model_initialises_from_the_seed():
    from models import build_model
    built = build_model(CFG, posenc.default_config("alibi"), 16, 3)
    direct = DecoderLM(CFG, posenc.default_config("alibi"), train_length=16, rngs=nnx.Rngs(3))
    for a, b in zip(jax.tree.leaves(nnx.state(built)), jax.tree.leaves(nnx.state(direct))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(built(tokens()), direct(tokens()))
