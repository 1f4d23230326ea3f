"""Gemma 3's block (ModelConfig: qk_norm, post_norms, global_every, local_rope_base) through
models.hf.load, from a Hugging Face folder and from a GGUF file written as llama.cpp writes it (norm
weights stored as 1 + w): the logits of an independent NumPy transcription of Hugging Face's
Gemma3ForCausalLM forward pass (transformers' modeling_gemma3: scaled embeddings, RMSNorm with scale
1 + w before and after each branch, q and k normed per head before RoPE, windowed layers at RoPE base
10,000 and a global layer every N at the model's base, GeGLU, tied output)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.formats import hf
from models.config import ModelConfig
from models.formats.hf_mapping import HFError, model_config
from tests.gguf_files import hf_folder, write

D, HEADS, KV, HEAD_DIM, FF, LAYERS, VOCAB, WINDOW, EVERY = 64, 2, 1, 32, 96, 3, 320, 8, 3
LOCAL_BASE, GLOBAL_BASE, EPS = 10000.0, 1000000.0, 1e-6


def gemma3_config() -> dict:
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": D,
            "intermediate_size": FF, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV, "head_dim": HEAD_DIM, "rms_norm_eps": EPS, "vocab_size": VOCAB,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 64, "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "query_pre_attn_scalar": HEAD_DIM, "tie_word_embeddings": True,
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_BASE},
                                "full_attention": {"rope_type": "default", "rope_theta": GLOBAL_BASE}}}


def gemma3_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (VOCAB, D), "model.norm.weight": (D,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({p + n + ".weight": (D,) for n in ("input_layernorm", "post_attention_layernorm",
                                                        "pre_feedforward_layernorm", "post_feedforward_layernorm")})
        shapes.update({p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
                       p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, D), p + "self_attn.k_proj.weight": (KV * HEAD_DIM, D),
                       p + "self_attn.v_proj.weight": (KV * HEAD_DIM, D), p + "self_attn.o_proj.weight": (D, HEADS * HEAD_DIM),
                       p + "mlp.gate_proj.weight": (FF, D), p + "mlp.up_proj.weight": (FF, D),
                       p + "mlp.down_proj.weight": (D, FF)})
    return {k: (0.3 * rng.standard_normal(s) if len(s) == 1 else 0.08 * rng.standard_normal(s)).astype(np.float32)
            for k, s in shapes.items()}


# --- the reference: Hugging Face's Gemma 3 forward pass, transcribed in NumPy ------------------------

def _rms(x, w):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * (1.0 + w)


def _rope(x, base):  # x: T x H x K, HF's rotate_half layout
    t, k = x.shape[0], x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, k, 2) / k)
    angles = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1))[:, None], np.sin(np.concatenate([angles, angles], -1))[:, None]
    rotated = np.concatenate([-x[..., k // 2:], x[..., :k // 2]], -1)
    return x * cos + rotated * sin


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def reference_logits(tensors: dict, ids: np.ndarray, layer_types: list[str]) -> np.ndarray:
    w = {k: v.astype(np.float64) for k, v in tensors.items()}
    x = w["model.embed_tokens.weight"][ids] * np.float32(D ** 0.5)
    t = len(ids)
    for i, kind in enumerate(layer_types):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, HEADS, HEAD_DIM)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, KV, HEAD_DIM)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, KV, HEAD_DIM)
        q, k = _rms(q, w[p + "self_attn.q_norm.weight"]), _rms(k, w[p + "self_attn.k_norm.weight"])
        base = LOCAL_BASE if kind == "sliding_attention" else GLOBAL_BASE
        q, k = _rope(q, base), _rope(k, base)
        k, v = np.repeat(k, HEADS // KV, axis=1), np.repeat(v, HEADS // KV, axis=1)
        s = np.einsum("thk,shk->hts", q, k) * HEAD_DIM ** -0.5
        allowed = np.tril(np.ones((t, t), bool))
        if kind == "sliding_attention":
            allowed &= (np.arange(t)[:, None] - np.arange(t)[None, :]) < WINDOW
        s = np.where(allowed, s, -np.inf)
        p_ = np.exp(s - s.max(-1, keepdims=True))
        p_ /= p_.sum(-1, keepdims=True)
        out = np.einsum("hts,shk->thk", p_, v).reshape(t, HEADS * HEAD_DIM) @ w[p + "self_attn.o_proj.weight"].T
        x = x + _rms(out, w[p + "post_attention_layernorm.weight"])
        h = _rms(x, w[p + "pre_feedforward_layernorm.weight"])
        h = (_gelu_tanh(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
        x = x + _rms(h, w[p + "post_feedforward_layernorm.weight"])
    return _rms(x, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T


IDS = np.random.default_rng(1).integers(0, VOCAB, 24)


def test_a_hugging_face_folder_gives_the_reference_logits(tmp_path):
    tensors = gemma3_tensors()
    model, _ = hf.load(hf_folder(tmp_path / "gemma3", gemma3_config(), tensors))
    cfg = model.cfg
    assert (cfg.qk_norm, cfg.post_norms, cfg.attention_window, cfg.global_every, cfg.local_rope_base) == \
        (True, True, WINDOW, EVERY, LOCAL_BASE)
    assert [cfg.windowed(i) for i in range(LAYERS)] == [True, True, False]
    expected = reference_logits(tensors, IDS, gemma3_config()["layer_types"])
    np.testing.assert_allclose(np.asarray(model(IDS[None])[0]), expected, atol=2e-4, rtol=1e-4)
    # the window matters here (24 tokens, a window of 8): without it the logits differ
    plain = reference_logits(tensors, IDS, ["full_attention"] * LAYERS)
    assert np.abs(plain - expected).max() > 1e-2


def test_a_gguf_file_as_llama_cpp_writes_it_gives_the_reference_logits(tmp_path):
    """llama.cpp stores Gemma's norm weights as 1 + w, and writes no layer pattern (6 unless the key
    attention.sliding_window_pattern says) nor the windowed layers' base (10,000)."""
    tensors = gemma3_tensors()
    stored = {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in tensors.items()}
    meta = {"gemma3.attention.sliding_window": WINDOW, "gemma3.attention.key_length": HEAD_DIM,
            "gemma3.attention.value_length": HEAD_DIM, "gemma3.attention.sliding_window_pattern": EVERY}
    config = {**gemma3_config(), "rope_parameters": {"rope_type": "default", "rope_theta": GLOBAL_BASE}}
    write(tmp_path / "g.gguf", "gemma3", config, stored, meta=meta)
    model, tokenizer = hf.load(tmp_path / "g.gguf")
    assert model.cfg.global_every == EVERY and model.cfg.local_rope_base == LOCAL_BASE
    expected = reference_logits(tensors, IDS, gemma3_config()["layer_types"])
    np.testing.assert_allclose(np.asarray(model(IDS[None])[0]), expected, atol=2e-4, rtol=1e-4)


def test_what_the_decoder_does_not_compute_is_refused_by_name():
    for change, match in ((dict(query_pre_attn_scalar=168), "query_pre_attn_scalar"),
                          (dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
                          (dict(layer_types=["full_attention", "sliding_attention", "full_attention"]), "layer_types")):
        with pytest.raises(HFError, match=match):
            model_config({**gemma3_config(), **change}, "float32")
    with pytest.raises(HFError, match="cannot be exported"):
        hf.architecture_of(model_config(gemma3_config(), "float32"))


def test_the_block_options_are_checked():
    base = ModelConfig(attention_window=8, global_every=3, local_rope_base=1e4)
    base.check_block()
    with pytest.raises(ValueError, match="needs model.attention_window"):
        dataclasses.replace(base, attention_window=0).check_block()
    with pytest.raises(ValueError, match="needs model.global_every"):
        dataclasses.replace(base, global_every=0).check_block()


def test_lm_infinite_acts_on_the_global_layers_only(tmp_path):
    """LM-Infinite's sinks (model.attention_sinks) belong to the layers that see every key: Gemma 3's
    windowed layers keep their sliding window and no sinks, so within the global layers' window
    (the training length, 64 here) LM-Infinite is the model as trained, as on a Llama block; past it
    the global layer sees its window and the sinks (the logits differ from the model as trained)."""
    from flax import nnx
    from models.decoder import DecoderLM, layer_config
    from models.formats.hf import posenc_config
    model, _ = hf.load(hf_folder(tmp_path / "gemma3", gemma3_config(), gemma3_tensors()))
    cfg, length = model.cfg, model.scheme.dims.train_length
    lm_infinite = dataclasses.replace(cfg, attention_sinks=2)
    assert [(layer_config(lm_infinite, i).attention_window, layer_config(lm_infinite, i).attention_sinks)
            for i in range(LAYERS)] == [(WINDOW, 0), (WINDOW, 0), (0, 2)]
    graphdef = nnx.graphdef(DecoderLM(lm_infinite, posenc_config(gemma3_config()), length, rngs=nnx.Rngs(0)))
    sinks = nnx.merge(graphdef, nnx.state(model))
    sinks.compile_calls = True  # as hf.load sets it: each call one compiled program, not op by op
    ids = np.random.default_rng(2).integers(0, VOCAB, 2 * length)[None]
    np.testing.assert_allclose(np.asarray(sinks(ids[:, :length])[0]), np.asarray(model(ids[:, :length])[0]),
                               atol=1e-5, rtol=1e-5)
    assert np.abs(np.asarray(sinks(ids)[0, length:]) - np.asarray(model(ids)[0, length:])).max() > 1e-3
    # past the window the model as trained is still transformers' (its windowed layers: the window, no sinks)
    expected = reference_logits(gemma3_tensors(), ids[0], gemma3_config()["layer_types"])
    np.testing.assert_allclose(np.asarray(model(ids)[0]), expected, atol=2e-4, rtol=1e-4)
