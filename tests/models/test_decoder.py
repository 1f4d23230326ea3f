"""Properties every scheme must give the decoder (causality, prefix consistency, tile-wise bias), its
dropout, its config and how it is built."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.config import ModelConfig

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
    if posenc.get(name).traits.needs_full_rows:
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


def test_default_block_is_unchanged():
    """The default config's parameter tree and numbers, as before the Llama / GPT-NeoX block options
    (logits of seed 0 computed by the decoder as it was)."""
    model = make_model("alibi")
    shapes = {".".join(map(str, k)): v.get_value().shape for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    layer = {"attn.qkv.kernel": (32, 96), "attn.qkv.bias": (96,), "attn.out.kernel": (32, 32), "attn.out.bias": (32,),
             "fc1.kernel": (32, 64), "fc1.bias": (64,), "fc2.kernel": (64, 32), "fc2.bias": (32,),
             "ln1.scale": (32,), "ln1.bias": (32,), "ln2.scale": (32,), "ln2.bias": (32,)}
    expected = {"embed.embedding": (37, 32), "ln_f.scale": (32,), "ln_f.bias": (32,),
                **{f"blocks.{i}.{name}": shape for i in range(2) for name, shape in layer.items()}}
    assert shapes == expected
    out = np.asarray(model(jax.random.randint(jax.random.key(0), (2, 12), 0, 37)))
    np.testing.assert_allclose(out[1, -1, :6], [1.4642181, 0.01480271, -0.04519559, -0.10634472, 0.05489928,
                                                1.415127], atol=1e-5)
    np.testing.assert_allclose(out.sum(), 208.13742065429688, rtol=1e-5)


LLAMA_BLOCK = dict(norm="rmsnorm", norm_eps=1e-5, mlp="gated", activation="silu", num_kv_heads=2, qkv_bias=False,
                   out_bias=False, mlp_bias=False, scale_embeddings=False, tie_embeddings=False)


@pytest.mark.parametrize("block", [LLAMA_BLOCK, dict(LLAMA_BLOCK, qkv_bias=True, tie_embeddings=True, head_dim=16),
                                   dict(norm="layernorm", norm_eps=1e-5, activation="gelu_exact",
                                        parallel_residual=True, scale_embeddings=False)],
                         ids=["llama", "qwen2_head16", "gpt_neox"])
def test_hf_blocks_are_causal_and_every_attention_path_agrees(block):
    """The Llama-family and GPT-NeoX options build, train-free, a causal model whose attention paths
    (grouped-query k/v repeated for each) give the same logits."""
    cfg = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=48, attention_block=4, **block)
    rope = posenc.default_config("rope")
    rope.rope.fraction = 0.5
    model = DecoderLM(cfg, rope, train_length=16, rngs=nnx.Rngs(0))
    x = tokens()
    base = model(x)
    changed = x.at[:, 6:].set((x[:, 6:] + 7) % 37)
    np.testing.assert_allclose(model(changed)[:, :6], base[:, :6], atol=1e-5)
    for path in ("dense", "triangular", "blockwise", "fused", "pallas"):
        other = DecoderLM(dataclasses.replace(cfg, attention=path), rope, train_length=16, rngs=nnx.Rngs(0))
        np.testing.assert_allclose(other(x), base, atol=2e-5, err_msg=path)


def test_sliding_window_sees_the_last_w_keys_on_every_path():
    """model.attention_window (Mistral's sliding_window): one layer's output at t depends on tokens
    t - W + 1 .. t only (LM-Infinite's Lambda mask without sinks); the blockwise path gives the same
    logits, the others refuse it by name; attention statistics see the window."""
    from models.attention.statistics import qk_statistics
    cfg = ModelConfig(vocab_size=37, num_layers=1, d_model=32, num_heads=4, mlp_dim=48, attention_block=4,
                      attention_window=5, **{k: v for k, v in LLAMA_BLOCK.items() if k != "tie_embeddings"})
    rope = posenc.default_config("rope")
    model = DecoderLM(cfg, rope, train_length=16, rngs=nnx.Rngs(0))
    x = tokens()
    base = model(x)
    far = x.at[:, :4].set((x[:, :4] + 7) % 37)  # only tokens more than W - 1 = 4 back from t >= 8
    np.testing.assert_allclose(model(far)[:, 8:], base[:, 8:], atol=1e-5)
    assert not np.allclose(model(far)[:, 4:8], base[:, 4:8], atol=1e-3)
    other = DecoderLM(dataclasses.replace(cfg, attention="blockwise"), rope, train_length=16, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(other(x), base, atol=2e-5)
    for path in ("triangular", "fused", "pallas"):
        with pytest.raises(ValueError, match="attention_window"):
            DecoderLM(dataclasses.replace(cfg, attention=path), rope, train_length=16, rngs=nnx.Rngs(0))(x)
    q = jax.random.normal(jax.random.key(1), (1, T, 2, 8))
    pos = jnp.arange(T)[None]
    dist, _ = qk_statistics(q, q, pos, pos, model.scheme, block=4, window=5)
    assert float(dist.max()) <= 4.0 and float(dist[..., -1].min()) > 0.5


def test_hf_block_options_are_checked():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig.from_config({"d_model": 32, "num_heads": 4, "num_kv_heads": 3}, 10)
    with pytest.raises(ValueError, match="model.norm"):
        ModelConfig.from_config({"norm": "batchnorm"}, 10)
    with pytest.raises(ValueError, match="model.mlp"):
        ModelConfig.from_config({"mlp": "swiglu"}, 10)
    assert ModelConfig.from_config({"d_model": 30, "num_heads": 4, "head_dim": 8}, 10).head_size == 8
    with pytest.raises(ValueError, match="attention_window"):
        ModelConfig.from_config({"attention_window": -1}, 10)
