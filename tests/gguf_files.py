"""Tiny GGUF files for the tests, written with the gguf package's writer the way llama.cpp's converter
writes them (Llama's query/key rows permuted, norms and biases in F32, weights in the type asked
for), from HF-named float32 tensors: tests/fixtures/hf_tiny's, or random ones."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file, save_file

from models.formats.gguf import permute

HF_TINY = Path(__file__).resolve().parent / "fixtures" / "hf_tiny"
Q = gguf.GGMLQuantizationType
# where the f16 scales of a block sit (bytes), for the types gguf de-quantizes but cannot quantize:
# random blocks with these set to small numbers stand in for quantized weights
SCALE_OFFSETS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
# config.json's norm epsilon -> llama.cpp's key (RMSNorm's, LayerNorm's)
EPSILON_KEYS = {"rms_norm_eps": "layer_norm_rms_epsilon", "layer_norm_eps": "layer_norm_epsilon"}


def hf_tiny(arch: str) -> tuple[dict, dict[str, np.ndarray]]:
    """config.json and the float32 tensors of a tests/fixtures/hf_tiny checkpoint."""
    folder = HF_TINY / arch
    return json.loads((folder / "config.json").read_text()), load_file(folder / "model.safetensors")


def tiny_tokenizer_meta() -> dict:
    """tests/fixtures/hf_tiny/llama's byte-level BPE tokenizer as GGUF metadata (pre-tokenizer gpt2)."""
    spec = json.loads((HF_TINY / "llama" / "tokenizer.json").read_text())["model"]
    tokens = [t for t, _ in sorted(spec["vocab"].items(), key=lambda item: item[1])]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": [" ".join(m) for m in spec["merges"]],
            "tokenizer.ggml.token_type": [1] * len(tokens), "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False}


def quantize(array: np.ndarray, qtype: Q, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes GGUF holds for `array` in `qtype`, what gguf de-quantizes them to). Types gguf cannot
    quantize get random blocks (scales small), so their values are not `array`'s."""
    if qtype in SCALE_OFFSETS:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        data = rng.integers(0, 256, (array.shape[0], array.shape[1] // block, size), dtype=np.uint8)
        for offset in SCALE_OFFSETS[qtype]:
            scales = rng.uniform(0.002, 0.01, data.shape[:2]).astype(np.float16)
            data[..., offset:offset + 2] = scales.view(np.uint8).reshape(*data.shape[:2], 2)
        data = data.reshape(array.shape[0], -1)
    else:
        data = gguf.quants.quantize(array, qtype)
    return data, gguf.quants.dequantize(data, qtype)


def _add(writer: gguf.GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def write(path: Path, arch: str, config: dict, tensors: dict[str, np.ndarray], qtype: Q = Q.F32,
          meta: dict | None = None, tokenizer: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    """Write a GGUF file of architecture `arch` holding `tensors` (HF names, HF row order), hparams
    from `config` (config.json's keys), 2-d weights in `qtype`, extra metadata `meta` (full keys;
    None values leave a key out), tiny_tokenizer_meta() where `tokenizer`. Returns the tensors as
    the file holds them de-quantized, in HF's names and order (the dense reference)."""
    rng = np.random.default_rng(seed)
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    keys = {f"{arch}.block_count": config["num_hidden_layers"], f"{arch}.context_length": config["max_position_embeddings"],
            f"{arch}.embedding_length": config["hidden_size"], f"{arch}.feed_forward_length": config["intermediate_size"],
            f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": kv,
            f"{arch}.rope.freq_base": float(config["rope_parameters"]["rope_theta"]),
            **{f"{arch}.attention.{key}": float(config[eps]) for eps, key in EPSILON_KEYS.items() if eps in config},
            **(tiny_tokenizer_meta() if tokenizer else {}), **(meta or {})}
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        if value is not None:
            _add(writer, key, value)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    dense = {}
    for hf_name, array in tensors.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias")) or hf_name  # rope_freqs: GGUF's own
        rows = {"q_proj": heads, "k_proj": kv}.get(hf_name.split(".")[-2]) if arch == "llama" else None
        if array.ndim == 2 and qtype != Q.F32:
            data, dense[hf_name] = quantize(array.astype(np.float32), qtype, rng)
            writer.add_tensor(name, permute(data, rows) if rows else data, raw_dtype=qtype)
        else:
            dense[hf_name] = array.astype(np.float32)
            writer.add_tensor(name, permute(dense[hf_name], rows) if rows else dense[hf_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dense


def hf_folder(folder: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    """A HF checkpoint folder with `config` and `tensors` (the HF path's view of the same model)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


def random_llama(d: int = 256, layers: int = 1, vocab: int = 32, seed: int = 0) -> tuple[dict, dict]:
    """A Llama config and random tensors whose rows are a multiple of 256 long (the K-quants' block)."""
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": d, "intermediate_size": d,
              "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": d // 4,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "vocab_size": vocab, "hidden_act": "silu",
              "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, d), "lm_head.weight": (vocab, d), "model.norm.weight": (d,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (d // 2, d),
                       p + "self_attn.v_proj.weight": (d // 2, d), p + "self_attn.o_proj.weight": (d, d),
                       p + "mlp.gate_proj.weight": (d, d), p + "mlp.up_proj.weight": (d, d),
                       p + "mlp.down_proj.weight": (d, d)})
    tensors = {k: (1.0 + 0.1 * rng.standard_normal(s) if len(s) == 1 else 0.05 * rng.standard_normal(s))
               for k, s in shapes.items()}
    return config, {k: v.astype(np.float32) for k, v in tensors.items()}
