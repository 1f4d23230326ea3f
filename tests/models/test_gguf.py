"""models/formats/gguf.py through models.hf.load: tiny GGUF files written with gguf's writer
(tests/gguf_files.py) give the logits transformers computed for the same tensors (tests/fixtures/
hf_tiny), or those of the HF path's model built from the tensors they de-quantize to; the metadata
becomes the block and rope options; bad files are refused in one line naming the file."""
from __future__ import annotations

import json
import math

import gguf
import jax.numpy as jnp
import numpy as np
import pytest

from models.formats import hf
from models.formats.gguf import TENSOR_TYPES, GGUFCheckpoint, permute, unpermute
from tests.gguf_files import HF_TINY, Q, hf_folder, hf_tiny, random_llama, write

ROPE_PARAMETERS = json.loads((HF_TINY / "llama" / "rope_parameters.json").read_text())


def stored(arch: str, case: str):
    data = np.load(HF_TINY / arch / "logits.npz")
    return data[f"{case}_ids"], data[f"{case}_logits"]


def logits(model, ids) -> np.ndarray:
    return np.asarray(model(jnp.asarray(ids)[None])[0])


def llama3_divisors(rotary_dim: int, theta: float, p: dict) -> np.ndarray:
    """Llama 3's per-frequency divisors as llama.cpp stores them (rope_freqs.weight)."""
    inv = 1.0 / theta ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    wavelen, original = 2 * math.pi / inv, p["original_max_position_embeddings"]
    low, high, factor = p["low_freq_factor"], p["high_freq_factor"], p["factor"]
    smooth = (original / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, mid)).astype(np.float32)


def llama_meta(case: str) -> dict:
    p = ROPE_PARAMETERS[case]
    if case == "linear":
        return {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": p["factor"]}
    if case == "yarn":
        return {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": p["factor"],
                "llama.rope.scaling.original_context_length": p["original_max_position_embeddings"],
                "llama.rope.scaling.yarn_beta_fast": p["beta_fast"], "llama.rope.scaling.yarn_beta_slow": p["beta_slow"]}
    return {}


@pytest.mark.parametrize("case", ["default", "linear", "yarn", "llama3"])
def test_llama_gives_transformers_logits(tmp_path, case):
    """hf_tiny/llama written as llama.cpp writes it (q and k rows permuted, rope scaling in the
    metadata; Llama 3's as rope_freqs.weight) gives the logits transformers computed."""
    config, tensors = hf_tiny("llama")
    if case == "llama3":
        tensors = {**tensors, "rope_freqs.weight": llama3_divisors(32, 10000.0, ROPE_PARAMETERS["llama3"])}
    write(tmp_path / "m.gguf", "llama", config, tensors, meta=llama_meta(case))
    model, _ = hf.load(tmp_path / "m.gguf")
    ids, expected = stored("llama", case)
    out = logits(model, ids)
    print(f"llama/{case}: largest absolute logit difference {np.abs(out - expected).max():.3g}")
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=0)


def test_qwen2_gives_transformers_logits(tmp_path):
    """Qwen2: q/k/v biases, tied embeddings (no output.weight), no row permutation, rope base 1e6."""
    config, tensors = hf_tiny("qwen2")
    write(tmp_path / "q.gguf", "qwen2", config, tensors)
    checkpoint = GGUFCheckpoint(tmp_path / "q.gguf")
    assert checkpoint.config["tie_word_embeddings"] and checkpoint.config["rope_parameters"]["rope_theta"] == 1e6
    model, _ = hf.load(tmp_path / "q.gguf")
    assert model.cfg.tie_embeddings and model.cfg.qkv_bias and not model.cfg.out_bias
    ids, expected = stored("qwen2", "default")
    np.testing.assert_allclose(logits(model, ids), expected, atol=1e-4, rtol=0)


def test_metadata_becomes_the_config(tmp_path):
    """Heads, kv heads, eps, base, window and the token ids come from the metadata, as config.json."""
    config, tensors = hf_tiny("llama")
    write(tmp_path / "m.gguf", "llama", config, tensors)
    got = GGUFCheckpoint(tmp_path / "m.gguf").config
    for key in ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size",
                "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert got[key] == config[key], key
    assert got["rope_parameters"] == config["rope_parameters"]


QUANTIZED = [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.mark.parametrize("qtype", QUANTIZED, ids=[q.name for q in QUANTIZED])
def test_quantized_weights_give_the_dense_models_logits(tmp_path, qtype):
    """Weights in `qtype` (norms F32, as llama.cpp keeps them): the logits of the HF path's model
    built from the float32 tensors gguf de-quantizes them to. Rows of 256 fit every block size."""
    config, tensors = random_llama()
    dense = write(tmp_path / "m.gguf", "llama", config, tensors, qtype=qtype)
    assert any(not np.array_equal(dense[k], tensors[k]) for k in tensors)  # quantized, not the originals
    ids = np.arange(48) % config["vocab_size"]
    expected = logits(hf.load(hf_folder(tmp_path / "dense", config, dense))[0], ids)
    np.testing.assert_allclose(logits(hf.load(tmp_path / "m.gguf")[0], ids), expected, atol=1e-5, rtol=0)


def test_every_common_type_is_read():
    assert {Q.F32, Q.F16, Q.BF16, *QUANTIZED} <= set(TENSOR_TYPES)


def test_permutation_is_undone_rows_and_biases():
    x = np.arange(6 * 8 * 3).reshape(6 * 8, 3)
    np.testing.assert_array_equal(unpermute(permute(x, 6), 6), x)
    np.testing.assert_array_equal(unpermute(permute(x[:, 0], 6), 6), x[:, 0])
    assert not np.array_equal(permute(x, 6), x)


def test_bfloat16_load_casts_each_tensor(tmp_path):
    config, tensors = hf_tiny("llama")
    write(tmp_path / "m.gguf", "llama", config, tensors)
    model, _ = hf.load(tmp_path / "m.gguf", dtype="bfloat16")
    assert model.embed.embedding.get_value().dtype == jnp.bfloat16


def test_rope_parameters_override_the_files(tmp_path):
    config, tensors = hf_tiny("llama")
    write(tmp_path / "m.gguf", "llama", config, tensors)
    model, _ = hf.load(tmp_path / "m.gguf", rope_parameters=ROPE_PARAMETERS["dynamic"])
    ids, expected = stored("llama", "dynamic")
    np.testing.assert_allclose(logits(model, ids), expected, atol=1e-4, rtol=0)


def test_tokenizer_from_metadata_gives_tokenizer_json_ids(tmp_path):
    config, tensors = hf_tiny("llama")
    write(tmp_path / "m.gguf", "llama", config, tensors)
    _, tokenizer = hf.load(tmp_path / "m.gguf")
    tokenized = json.loads((HF_TINY / "llama" / "tokenized.json").read_text())
    assert tokenizer.encode(tokenized["text"]).ids[:256] == tokenized["ids"]
    assert tokenizer.decode(tokenizer.encode(tokenized["text"]).ids) == tokenized["text"]


@pytest.mark.parametrize("meta,words", [
    ({"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 4.0},
     "llama.rope.scaling.type 'longrope' is not supported; supported: none, linear, yarn"),
    ({"llama.embedding_length": None}, "metadata llama.embedding_length is missing"),
    ({"llama.rope.dimension_count": 16}, "rotary embedding on 16 of 32 features"),
    ({"tokenizer.ggml.pre": "falcon"}, "tokenizer.ggml.pre 'falcon' is not supported"),
])
def test_metadata_it_cannot_follow_is_refused_in_one_line(tmp_path, meta, words):
    config, tensors = hf_tiny("llama")
    write(tmp_path / "m.gguf", "llama", config, tensors, meta=meta)
    with pytest.raises(hf.HFError) as error:
        hf.load(tmp_path / "m.gguf")
    message = str(error.value)
    assert words in message and str(tmp_path / "m.gguf") in message and "\n" not in message, message


def test_a_missing_tensor_is_named(tmp_path):
    config, tensors = hf_tiny("llama")
    write(tmp_path / "m.gguf", "llama", config, {k: v for k, v in tensors.items() if "layers.1.mlp.up" not in k})
    with pytest.raises(hf.HFError, match=r"blk\.1\.ffn_up\.weight .*is missing"):
        hf.load(tmp_path / "m.gguf")


def test_a_missing_gguf_file_is_named_not_looked_for_on_the_hub(tmp_path):
    with pytest.raises(hf.HFError, match="cannot read the GGUF file") as error:
        hf.load(tmp_path / "absent.gguf")
    assert str(tmp_path / "absent.gguf") in str(error.value)
