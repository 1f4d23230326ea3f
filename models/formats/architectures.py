"""Every checkpoint architecture as one row of `ARCHITECTURES`: what Llama, Mistral, Qwen2, GPT-NeoX
and Gemma 3 differ in, written once, and read by the loader and exporter (hf.py through hf_mapping.py)
and by the GGUF reader (gguf.py), which hold no per-architecture branch. An architecture whose block
the decoder already computes (ModelConfig's options) is one row here and nothing else.

A row (`Architecture`) holds:
  hf_name, model_type   config.json's `architectures[0]` and `model_type`
  block                 config.json -> the ModelConfig options of its block (beyond the shape that
                        every architecture reads alike: hf_mapping.model_config); HFError for what
                        the decoder does not compute
  to_config             the inverse: the block's own keys of config.json (None: not exported). The
                        exporter takes the first row whose two conversions give the block back
  weights               the weight table (hf_mapping's docstring: HF names, our path, rule)
  activation            the activation where config.json names none (read from `activation_keys`)
  unapplied_window      a window the checkpoint has and the decoder does not apply (a warning at load)
  gguf                  its GGUF form (None: no GGUF file of it is read): `GGUFForm`
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from models.config import ModelConfig
from models.formats import HFError

WeightRow = tuple[tuple[str, ...], str, str]  # (HF tensor names, our parameter path, rule of hf_mapping.RULES)


@dataclasses.dataclass(frozen=True)
class MetadataKey:
    """A GGUF metadata key of the architecture's own (`{gguf name}.{suffix}`) and the config.json key
    it is; read one way, written the other. `default`: where the file has none (None: it must)."""
    suffix: str
    config_key: str
    default: Any = None


RMS_EPSILON = MetadataKey("attention.layer_norm_rms_epsilon", "rms_norm_eps", 1e-5)


@dataclasses.dataclass(frozen=True)
class GGUFForm:
    """How llama.cpp writes the architecture: `name` (general.architecture, also the prefix of its
    keys and gguf's tensor-name table); `keys`, its metadata beyond the shape every GGUF file gives
    (gguf.py); `rotary_rows_interleaved`: the query and key weights' rows (and biases) reordered so
    that rotary pairs are adjacent (llama.cpp's Llama; HF's pairs lie half a head apart);
    `norm_offset`: stored norm weights = HF's + offset (Gemma's 1 + w); `derived`: config.json keys
    that follow from the others (read only); `rope_freqs`: llama.cpp reads per-frequency divisors
    (tensor rope_freqs.weight: Llama 3's scaling) for it (an export of such scaling needs it)."""
    name: str
    keys: tuple[MetadataKey, ...] = (RMS_EPSILON,)
    rotary_rows_interleaved: bool = False
    norm_offset: float = 0.0
    derived: Callable[[dict], dict] | None = None
    rope_freqs: bool = False


@dataclasses.dataclass(frozen=True)
class Architecture:
    hf_name: str
    model_type: str
    block: Callable[[dict, int], dict]                          # (config.json, head_dim) -> ModelConfig options
    weights: tuple[WeightRow, ...]
    to_config: Callable[[ModelConfig, dict], dict] | None = None  # (block, HF's rope dict) -> config.json keys
    activation: str = "silu"
    activation_keys: tuple[str, ...] = ("hidden_act",)
    unapplied_window: Callable[[dict], int] | None = None
    gguf: GGUFForm | None = None


# --- the weight tables ----------------------------------------------------------------------------

_LLAMA_LAYER = "model.layers.{i}."
_QKV = tuple(_LLAMA_LAYER + f"self_attn.{p}_proj" for p in "qkv")
LLAMA_WEIGHTS = (
    (("model.embed_tokens.weight",), "embed.embedding", "copy"),
    (("lm_head.weight",), "unembed.kernel", "linear"),
    (("model.norm.weight",), "ln_f.scale", "copy"),
    ((_LLAMA_LAYER + "input_layernorm.weight",), "blocks.{i}.ln1.scale", "copy"),
    ((_LLAMA_LAYER + "post_attention_layernorm.weight",), "blocks.{i}.ln2.scale", "copy"),
    (tuple(n + ".weight" for n in _QKV), "blocks.{i}.attn.qkv.kernel", "qkv"),
    (tuple(n + ".bias" for n in _QKV), "blocks.{i}.attn.qkv.bias", "qkv"),
    ((_LLAMA_LAYER + "self_attn.o_proj.weight",), "blocks.{i}.attn.out.kernel", "linear"),
    ((_LLAMA_LAYER + "self_attn.o_proj.bias",), "blocks.{i}.attn.out.bias", "copy"),
    ((_LLAMA_LAYER + "mlp.gate_proj.weight",), "blocks.{i}.gate.kernel", "linear"),
    ((_LLAMA_LAYER + "mlp.gate_proj.bias",), "blocks.{i}.gate.bias", "copy"),
    ((_LLAMA_LAYER + "mlp.up_proj.weight",), "blocks.{i}.fc1.kernel", "linear"),
    ((_LLAMA_LAYER + "mlp.up_proj.bias",), "blocks.{i}.fc1.bias", "copy"),
    ((_LLAMA_LAYER + "mlp.down_proj.weight",), "blocks.{i}.fc2.kernel", "linear"),
    ((_LLAMA_LAYER + "mlp.down_proj.bias",), "blocks.{i}.fc2.bias", "copy"),
)

GEMMA3_WEIGHTS = (
    (("model.embed_tokens.weight",), "embed.embedding", "copy"),
    (("model.norm.weight",), "ln_f.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "input_layernorm.weight",), "blocks.{i}.ln1.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "post_attention_layernorm.weight",), "blocks.{i}.ln_attn_out.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "pre_feedforward_layernorm.weight",), "blocks.{i}.ln2.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "post_feedforward_layernorm.weight",), "blocks.{i}.ln_mlp_out.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "self_attn.q_norm.weight",), "blocks.{i}.attn.q_norm.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "self_attn.k_norm.weight",), "blocks.{i}.attn.k_norm.scale", "gemma_norm"),
    *(row for row in LLAMA_WEIGHTS if row[1].startswith(("blocks.{i}.attn.qkv", "blocks.{i}.attn.out",
                                                          "blocks.{i}.gate", "blocks.{i}.fc"))),
)

_NEOX_LAYER = "gpt_neox.layers.{i}."
_NEOX_PAIRS = (  # (HF module, our module, rule of the weight); each has a weight and a bias
    ("gpt_neox.final_layer_norm", "ln_f", "copy"),
    (_NEOX_LAYER + "input_layernorm", "blocks.{i}.ln1", "copy"),
    (_NEOX_LAYER + "post_attention_layernorm", "blocks.{i}.ln2", "copy"),
    (_NEOX_LAYER + "attention.query_key_value", "blocks.{i}.attn.qkv", "neox"),
    (_NEOX_LAYER + "attention.dense", "blocks.{i}.attn.out", "linear"),
    (_NEOX_LAYER + "mlp.dense_h_to_4h", "blocks.{i}.fc1", "linear"),
    (_NEOX_LAYER + "mlp.dense_4h_to_h", "blocks.{i}.fc2", "linear"),
)
GPT_NEOX_WEIGHTS = (
    (("gpt_neox.embed_in.weight",), "embed.embedding", "copy"),
    (("embed_out.weight",), "unembed.kernel", "linear"),
    *(((hf + ".weight",), ours + (".scale" if rule == "copy" else ".kernel"), rule)
      for hf, ours, rule in _NEOX_PAIRS),
    *(((hf + ".bias",), ours + ".bias", "neox" if rule == "neox" else "copy") for hf, ours, rule in _NEOX_PAIRS),
)


# --- the blocks, read from config.json and written back -------------------------------------------

def rms_block(config: dict) -> dict:
    """What the Llama family shares: RMSNorm, a gated MLP, grouped-query attention."""
    return dict(norm="rmsnorm", norm_eps=config.get("rms_norm_eps", 1e-6), mlp="gated",
                num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"])


def rms_keys(cfg: ModelConfig) -> dict:
    return {"rms_norm_eps": cfg.norm_eps, "num_key_value_heads": cfg.kv_heads}


def llama_block(config: dict, head_dim: int) -> dict:
    bias = bool(config.get("attention_bias", False))
    return {**rms_block(config), "qkv_bias": bias, "out_bias": bias, "mlp_bias": bool(config.get("mlp_bias", False))}


def llama_keys(cfg: ModelConfig, rope: dict) -> dict:
    return {**rms_keys(cfg), "attention_bias": cfg.qkv_bias, "mlp_bias": cfg.mlp_bias}


def mistral_block(config: dict, head_dim: int) -> dict:
    """Llama's block with a sliding window over every layer."""
    return {**llama_block(config, head_dim), "attention_window": int(config.get("sliding_window") or 0)}


def mistral_keys(cfg: ModelConfig, rope: dict) -> dict:
    """No bias keys: HF's Mistral has none, so a block with biases has no Mistral form."""
    return {**rms_keys(cfg), "sliding_window": cfg.attention_window}


def qwen2_block(config: dict, head_dim: int) -> dict:
    """q/k/v biases always, none on o_proj."""
    return {**rms_block(config), "qkv_bias": True, "out_bias": False, "mlp_bias": bool(config.get("mlp_bias", False))}


def qwen2_unapplied_window(config: dict) -> int:
    """Qwen2's `use_sliding_window`, which holds only from layer `max_window_layers` on."""
    return int(config.get("sliding_window") or 0) if config.get("use_sliding_window", False) else 0


def neox_block(config: dict, head_dim: int) -> dict:
    """LayerNorm, a plain MLP with biases, one fused q/k/v projection, the parallel residual."""
    bias = bool(config.get("attention_bias", True))
    return dict(norm="layernorm", norm_eps=config.get("layer_norm_eps", 1e-5), qkv_bias=bias, out_bias=bias,
                parallel_residual=config.get("use_parallel_residual", True))


def neox_keys(cfg: ModelConfig, rope: dict) -> dict:
    return {"layer_norm_eps": cfg.norm_eps, "attention_bias": cfg.qkv_bias,
            "use_parallel_residual": cfg.parallel_residual, "rotary_pct": rope.get("partial_rotary_factor", 1.0)}


def gemma3_block(config: dict, head_dim: int) -> dict:
    """Gemma 3's block: RMSNorm (scale 1 + weight, gemma_norm) before and after each branch, q and k
    normed per head, GeGLU, embeddings x sqrt(d), windowed layers with a global one every N
    (`layer_types`, or `sliding_window_pattern`) at their own RoPE base. HFError for what the decoder
    does not compute: another attention scale than head_dim^-0.5, soft-capped logits, an irregular
    pattern of layer types."""
    scalar = config.get("query_pre_attn_scalar", head_dim)
    if scalar != head_dim:
        raise HFError(f"config.json: query_pre_attn_scalar {scalar} differs from head_dim {head_dim}; only the "
                      f"scale head_dim^-0.5 is supported")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(key) is not None:
            raise HFError(f"config.json: {key} {config[key]} is not supported (no soft-capping in the decoder)")
    layers = config["num_hidden_layers"]
    types = config.get("layer_types") or [
        "full_attention" if (i + 1) % int(config.get("sliding_window_pattern", 6)) == 0 else "sliding_attention"
        for i in range(layers)]
    full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    every = full[0] + 1 if full else layers + 1
    if types != ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]:
        raise HFError(f"config.json: layer_types {types} is not a global layer every N layers; not supported")
    nested = config.get("rope_parameters") or {}
    local = config.get("rope_local_base_freq") or (nested.get("sliding_attention") or {}).get("rope_theta") or 1e4
    bias = bool(config.get("attention_bias", False))
    return {**rms_block(config), "qkv_bias": bias, "out_bias": bias, "mlp_bias": False, "qk_norm": True,
            "post_norms": True, "attention_window": int(config["sliding_window"]), "global_every": every,
            "local_rope_base": float(local), "scale_embeddings": True,
            "tie_embeddings": bool(config.get("tie_word_embeddings", True))}


def gemma3_query_scale(config: dict) -> dict:
    """llama.cpp scales the 27B model's (62 layers) queries by (d / heads)^-0.5, the others' by
    head_dim^-0.5, and writes neither."""
    if config["num_hidden_layers"] == 62:
        return {"query_pre_attn_scalar": config["hidden_size"] // config["num_attention_heads"]}
    return {"query_pre_attn_scalar": config["head_dim"]}


# What llama.cpp fixes for Gemma 3 rather than writing it (its llama-model.cpp): a global layer
# every 6, the windowed layers' RoPE base 10,000; used where the file has no key for them
GEMMA3_GGUF = GGUFForm("gemma3", norm_offset=1.0, derived=gemma3_query_scale, keys=(
    RMS_EPSILON, MetadataKey("attention.sliding_window", "sliding_window"),
    MetadataKey("attention.sliding_window_pattern", "sliding_window_pattern", 6),
    MetadataKey("rope.freq_base_swa", "rope_local_base_freq", 10000.0)))

ARCHITECTURES: dict[str, Architecture] = {  # export takes the first row that fits: Llama before Mistral
    "llama": Architecture("LlamaForCausalLM", "llama", llama_block, LLAMA_WEIGHTS, llama_keys,
                          gguf=GGUFForm("llama", rotary_rows_interleaved=True, rope_freqs=True)),
    "mistral": Architecture("MistralForCausalLM", "mistral", mistral_block, LLAMA_WEIGHTS, mistral_keys),
    "qwen2": Architecture("Qwen2ForCausalLM", "qwen2", qwen2_block, LLAMA_WEIGHTS, llama_keys,
                          unapplied_window=qwen2_unapplied_window, gguf=GGUFForm("qwen2")),
    "gpt-neox": Architecture("GPTNeoXForCausalLM", "gpt_neox", neox_block, GPT_NEOX_WEIGHTS, neox_keys,
                             activation="gelu"),
    "gemma3": Architecture("Gemma3ForCausalLM", "gemma3_text", gemma3_block, GEMMA3_WEIGHTS,
                           activation="gelu_pytorch_tanh", activation_keys=("hidden_activation", "hidden_act"),
                           gguf=GEMMA3_GGUF),  # its text model; not exported
}


def hf_names() -> list[str]:
    return [row.hf_name for row in ARCHITECTURES.values()]


def by_hf_name(name: str, where: str = "config.json") -> Architecture:
    """The row whose config.json says `architectures: [name]` (HFError naming `where` if none)."""
    for row in ARCHITECTURES.values():
        if row.hf_name == name:
            return row
    raise HFError(f"{where}: architecture {name} is not supported; supported: {', '.join(hf_names())}")


def by_gguf_name(name: str, where: str) -> Architecture:
    """The row whose GGUF files say `general.architecture = name` (HFError naming `where` if none)."""
    for row in ARCHITECTURES.values():
        if row.gguf is not None and row.gguf.name == name:
            return row
    supported = [row.gguf.name for row in ARCHITECTURES.values() if row.gguf is not None]
    raise HFError(f"{where}: architecture {name!r} is not supported; supported: {', '.join(supported)}")
