"""A long sequence's forward pass (beyond two attention blocks): the head and the MLP run chunk by chunk
with the same results as at once, `token_nll` / `next_tokens` never build B x T x V logits, XLA's
temporaries do not grow with the number of layers, and a model loaded for use (`compile_calls`) runs
`model(ids)` as one compiled program."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM, compiled
from models.config import ModelConfig

CFG = ModelConfig(vocab_size=97, num_layers=2, d_model=32, num_heads=4, mlp_dim=64, attention_block=16,
                  num_kv_heads=2, norm="rmsnorm", mlp="gated", activation="silu", tie_embeddings=True)
T = 80  # 5 attention blocks: long (choice.is_long)


def model_of(cfg: ModelConfig = CFG, name: str = "rope") -> DecoderLM:
    return DecoderLM(cfg, posenc.default_config(name), train_length=32, rngs=nnx.Rngs(0))


def tokens(b=2, t=T):
    return jax.random.randint(jax.random.key(1), (b, t), 0, CFG.vocab_size)


def test_chunked_head_mlp_and_attention_equal_one_block_of_the_whole_sequence():
    """attention_block = T: nothing chunked (dense paths); 16: head, MLP and attention in tiles."""
    x = tokens()
    whole = model_of(dataclasses.replace(CFG, attention_block=T))
    tiled = model_of()
    whole.compile_calls = tiled.compile_calls = True  # each call one program (op by op took ~4x as long)
    full = whole(x)
    np.testing.assert_allclose(tiled(x), full, atol=2e-5, rtol=1e-5)
    nll = nnx.jit(lambda m, a, b: m.token_nll(a, b))(tiled, x[:, :-1], x[:, 1:])
    logits = whole(x[:, :-1])
    expected = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, x[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(nll, expected, atol=2e-5, rtol=1e-5)
    np.testing.assert_array_equal(nnx.jit(lambda m, a: m.next_tokens(a))(tiled, x), jnp.argmax(full, -1))


def test_long_nll_and_predictions_hold_no_logits_of_the_whole_sequence():
    """XLA's planned temporaries of token_nll at T tokens stay below one B x T x V float32 array."""
    model = model_of(dataclasses.replace(CFG, vocab_size=4096))
    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct((2, 512), jnp.int32)
    logits_bytes = 2 * 512 * 4096 * 4
    for fn in (lambda m, t: m.token_nll(t, t), lambda m, t: m.next_tokens(t)):
        stats = jax.jit(lambda s, t: fn(nnx.merge(graphdef, s), t)).lower(state, x).compile().memory_analysis()
        assert stats.temp_size_in_bytes < logits_bytes / 2, (stats.temp_size_in_bytes, logits_bytes)


def test_temporaries_of_a_long_forward_do_not_grow_with_the_layers():
    """XLA:CPU's scheduler allocated every layer's loop buffers up front (models/attention/tiles.py:
    map_after): 8 layers planned ~4x the temporaries of 2. Now about the same."""
    sizes = {}
    for layers in (2, 8):
        model = model_of(dataclasses.replace(CFG, num_layers=layers))
        graphdef, state = nnx.split(model)
        x = jax.ShapeDtypeStruct((1, 1024), jnp.int32)
        hidden = jax.jit(lambda s, t: nnx.merge(graphdef, s).hidden(t)).lower(state, x).compile()
        sizes[layers] = hidden.memory_analysis().temp_size_in_bytes
    assert sizes[8] < 1.5 * sizes[2], sizes


def test_blockwise_gradients_equal_dense_gradients():
    """map_after keeps blockwise attention differentiable (training at long lengths)."""
    x = tokens(1, 64)
    grads = {}
    for path in ("blockwise", "dense"):
        model = model_of(dataclasses.replace(CFG, attention=path))
        graphdef, state = nnx.split(model)
        grads[path] = jax.jit(jax.grad(lambda s: nnx.merge(graphdef, s).token_nll(x[:, :-1], x[:, 1:]).mean()))(state)
    for a, b in zip(jax.tree.leaves(grads["blockwise"]), jax.tree.leaves(grads["dense"])):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_compile_calls_runs_one_program_per_shape(monkeypatch):
    model = model_of()
    x = tokens()
    eager = model(x)
    model.compile_calls = True
    compiled._program.cache_clear()
    programs = []
    real = compiled._program.__wrapped__
    monkeypatch.setattr(compiled, "_program", lambda graphdef: programs.append(graphdef) or real(graphdef))
    out = model(x)
    assert len(programs) == 1
    np.testing.assert_allclose(out, eager, atol=2e-5, rtol=1e-5)
    # inside a trace the model runs as it is (no program within the program)
    traced = jax.jit(lambda t: model(t))(x)
    assert len(programs) == 1
    np.testing.assert_allclose(traced, eager, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "t5", "fox", "cope"])
def test_long_evaluation_of_other_schemes_equals_dense(name):
    """The three-way tile choice (skip, below the diagonal, the diagonal) for bias, input-reading and
    carried-bias schemes."""
    x = tokens(1, T)
    model = model_of(dataclasses.replace(CFG, attention="blockwise"), name)
    dense = model_of(dataclasses.replace(CFG, attention="dense"), name)
    np.testing.assert_allclose(model(x), dense(x), atol=5e-5, rtol=1e-4)
