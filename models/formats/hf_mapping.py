"""What a Hugging Face checkpoint is in this project's terms: its config.json as a ModelConfig and
`rope` options, and its tensors as our parameters (one table per architecture, read both ways, so
that models/formats/hf.py loads and exports with the same rows).

A table row is (HF tensor names, our parameter path, rule); `{i}` stands for the layer index. A
row applies where our model has that parameter (the untied output projection, the biases the
config switches on), so one table serves every variant of its family. Rules (`RULES`), with
H query heads, G key/value heads and K features per head:

  copy     the same array (embeddings, norm scales and biases, output-projection biases)
  linear   transposed: HF's nn.Linear weight is out x in, our kernel in x out
  qkv      q, k, v (H*K, G*K, G*K rows) concatenated along the output, then transposed (if 2-d)
  neox     GPT-NeoX's fused query_key_value, laid out per head as [q_h, k_h, v_h] (3*K rows each):
           regrouped into all q, all k, all v, then transposed (if 2-d)
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp

from models.config import ModelConfig
from posenc.domains import above, at_least, between, positive


class HFError(ValueError):
    """A checkpoint that cannot be loaded or exported; the message is one line naming what and why."""


LLAMA_FAMILY = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
GEMMA3 = "Gemma3ForCausalLM"  # imported (its text model: windowed and global layers); not exported
EXPORTABLE = LLAMA_FAMILY + ("GPTNeoXForCausalLM",)
ARCHITECTURES = EXPORTABLE + (GEMMA3,)
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu_exact", "gelu_new": "gelu",
               "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu", "relu": "relu"}
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


@dataclasses.dataclass(frozen=True)
class Heads:
    """What the rules need to know of the attention's shape."""
    num_heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, cfg: ModelConfig) -> "Heads":
        return cls(cfg.num_heads, cfg.kv_heads, cfg.head_size)


def _t(x):
    return x.T if x.ndim == 2 else x


def _qkv_in(arrays, heads: Heads):
    return _t(jnp.concatenate(arrays, axis=0))


def _qkv_out(x, heads: Heads):
    q, kv = heads.num_heads * heads.head_dim, heads.kv_heads * heads.head_dim
    return list(jnp.split(_t(x), [q, q + kv], axis=0))


def _regroup(x, first: int, second: int, head_dim: int):
    """Rows (first, second, head_dim, ...) -> (second, first, head_dim, ...), flattened back."""
    return x.reshape(first, second, head_dim, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)


def _neox_in(arrays, heads: Heads):
    return _t(_regroup(arrays[0], heads.num_heads, 3, heads.head_dim))


def _neox_out(x, heads: Heads):
    return [_regroup(_t(x), 3, heads.num_heads, heads.head_dim)]


@dataclasses.dataclass(frozen=True)
class Rule:
    to_ours: Callable  # (HF arrays, Heads) -> our array
    to_hf: Callable    # (our array, Heads) -> HF arrays, in the row's order


RULES = {
    "copy": Rule(lambda arrays, heads: arrays[0], lambda x, heads: [x]),
    # Gemma's RMSNorm multiplies by (1 + weight): our scale is HF's weight + 1
    "gemma_norm": Rule(lambda arrays, heads: arrays[0] + 1.0, lambda x, heads: [x - 1.0]),
    "linear": Rule(lambda arrays, heads: arrays[0].T, lambda x, heads: [x.T]),
    "qkv": Rule(_qkv_in, _qkv_out),
    "neox": Rule(_neox_in, _neox_out),
}

_LLAMA_LAYER = "model.layers.{i}."
_QKV = tuple(_LLAMA_LAYER + f"self_attn.{p}_proj" for p in "qkv")
LLAMA_TABLE = (
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

GEMMA3_TABLE = (
    (("model.embed_tokens.weight",), "embed.embedding", "copy"),
    (("model.norm.weight",), "ln_f.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "input_layernorm.weight",), "blocks.{i}.ln1.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "post_attention_layernorm.weight",), "blocks.{i}.ln_attn_out.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "pre_feedforward_layernorm.weight",), "blocks.{i}.ln2.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "post_feedforward_layernorm.weight",), "blocks.{i}.ln_mlp_out.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "self_attn.q_norm.weight",), "blocks.{i}.attn.q_norm.scale", "gemma_norm"),
    ((_LLAMA_LAYER + "self_attn.k_norm.weight",), "blocks.{i}.attn.k_norm.scale", "gemma_norm"),
    *(row for row in LLAMA_TABLE if row[1].startswith(("blocks.{i}.attn.qkv", "blocks.{i}.attn.out",
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
GPT_NEOX_TABLE = (
    (("gpt_neox.embed_in.weight",), "embed.embedding", "copy"),
    (("embed_out.weight",), "unembed.kernel", "linear"),
    *(((hf + ".weight",), ours + (".scale" if rule == "copy" else ".kernel"), rule)
      for hf, ours, rule in _NEOX_PAIRS),
    *(((hf + ".bias",), ours + ".bias", "neox" if rule == "neox" else "copy") for hf, ours, rule in _NEOX_PAIRS),
)


def table(architecture: str) -> tuple:
    """The weight table of an architecture (see the module docstring)."""
    return {"GPTNeoXForCausalLM": GPT_NEOX_TABLE, GEMMA3: GEMMA3_TABLE}.get(architecture, LLAMA_TABLE)


def rows(architecture: str, num_layers: int):
    """The table's rows with `{i}` filled in: (HF names, our path, rule), layer rows once per layer."""
    for names, ours, rule in table(architecture):
        layers = range(num_layers) if "{i}" in ours else (None,)
        for i in layers:
            yield tuple(n.format(i=i) for n in names), ours.format(i=i), rule


def read_config(folder: Path) -> dict:
    """config.json of a checkpoint folder, its architecture checked."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise HFError(f"{path}: cannot read the checkpoint's config ({type(e).__name__}: {e})") from None
    architecture = (config.get("architectures") or ["(none)"])[0]
    if architecture not in ARCHITECTURES:
        raise HFError(f"{path}: architecture {architecture} is not supported; supported: {', '.join(ARCHITECTURES)}")
    return config


def unapplied_window(config: dict) -> int:
    """A sliding window the decoder does not apply (0: none): Qwen2's where `use_sliding_window`, which
    holds only from layer `max_window_layers` on. Such a model is exact only up to the window
    (models/formats/hf.py warns at load). Mistral's `sliding_window` is applied (model.attention_window)."""
    if config["architectures"][0] == "Qwen2ForCausalLM" and config.get("use_sliding_window", False):
        return int(config.get("sliding_window") or 0)
    return 0


def model_config(config: dict, dtype: str) -> ModelConfig:
    """The ModelConfig of a HF config.json (block options as that architecture builds its layers)."""
    architecture = config["architectures"][0]
    act = config.get("hidden_act", "gelu" if architecture == "GPTNeoXForCausalLM" else "silu")
    if architecture == GEMMA3:
        act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise HFError(f"config.json: hidden_act {act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    heads, d_model = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or d_model // heads
    common = dict(vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"], d_model=d_model,
                  num_heads=heads, mlp_dim=config["intermediate_size"], activation=ACTIVATIONS[act],
                  tie_embeddings=bool(config.get("tie_word_embeddings", False)), dtype=dtype,
                  head_dim=0 if head_dim * heads == d_model else head_dim, scale_embeddings=False)
    if architecture == "GPTNeoXForCausalLM":
        bias = bool(config.get("attention_bias", True))
        cfg = ModelConfig(**common, norm="layernorm", norm_eps=config.get("layer_norm_eps", 1e-5),
                          qkv_bias=bias, out_bias=bias, parallel_residual=config.get("use_parallel_residual", True))
    elif architecture == GEMMA3:
        cfg = ModelConfig(**{**common, "scale_embeddings": True,
                             "tie_embeddings": bool(config.get("tie_word_embeddings", True))},
                          **_gemma3_block(config, head_dim))
    else:
        bias = bool(config.get("attention_bias", False))
        qwen = architecture == "Qwen2ForCausalLM"  # Qwen2: q/k/v biases always, none on o_proj
        window = int(config.get("sliding_window") or 0) if architecture == "MistralForCausalLM" else 0
        cfg = ModelConfig(**common, norm="rmsnorm", norm_eps=config.get("rms_norm_eps", 1e-6), mlp="gated",
                          num_kv_heads=config.get("num_key_value_heads") or heads, qkv_bias=qwen or bias,
                          out_bias=bias and not qwen, mlp_bias=bool(config.get("mlp_bias", False)),
                          attention_window=window)
    try:
        cfg.check_block()
    except ValueError as e:
        raise HFError(f"config.json: {e}") from None
    return cfg


def _gemma3_block(config: dict, head_dim: int) -> dict:
    """Gemma 3's block options: RMSNorm (scale 1 + weight, gemma_norm) before and after each branch,
    q and k normed per head, GeGLU, embeddings x sqrt(d), windowed layers with a global one every N
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
    return dict(norm="rmsnorm", norm_eps=config.get("rms_norm_eps", 1e-6), mlp="gated",
                num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
                qkv_bias=bool(config.get("attention_bias", False)), out_bias=bool(config.get("attention_bias", False)),
                mlp_bias=False, qk_norm=True, post_norms=True, attention_window=int(config["sliding_window"]),
                global_every=every, local_rope_base=float(local))


def rope_parameters_of(config: dict, override: dict | None = None) -> dict:
    """HF's rope parameters in their current form: config.json's `rope_parameters` (or the older
    `rope_scaling`, `type` read as `rope_type`), `override` in their place where given; rope_theta
    and partial_rotary_factor from the checkpoint where the chosen dict has none."""
    saved = config.get("rope_parameters") or {}
    saved = saved.get("full_attention", saved)  # Gemma 3's per layer type: the global layers' (the scheme's)
    params = dict(override if override is not None else saved or config.get("rope_scaling") or {})
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    theta = saved.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    params.setdefault("rope_theta", theta)
    fraction = saved.get("partial_rotary_factor", config.get("partial_rotary_factor", config.get("rotary_pct")))
    if fraction is not None:
        params.setdefault("partial_rotary_factor", fraction)
    return params


# The values of HF's rope dict, checked before they become our options (an error then names HF's key,
# the one written in the dict, not the option it becomes): key -> (domain, rope types it is checked for).
ROPE_VALUE_DOMAINS = {
    "factor": (positive(), ("linear", "longrope")), "rope_theta": (positive(), ROPE_TYPES),
    "partial_rotary_factor": (between(0, 1, lo_open=True), ROPE_TYPES),
    "low_freq_factor": (positive(), ("llama3",)),
    "high_freq_factor": (above(lambda p: p.get("low_freq_factor") or 0, "low_freq_factor"), ("llama3",)),
    "beta_fast": (positive(), ("yarn",)), "beta_slow": (positive(), ("yarn",)),
    "attention_factor": (at_least(0), ("yarn", "longrope")),
    "original_max_position_embeddings": (at_least(1), ("yarn", "llama3", "longrope")),
}
SCALING_FACTOR = at_least(1, note="L_target / L_train")  # dynamic, yarn, llama3: factor


def check_rope_values(params: dict) -> None:
    """Each number of HF's rope dict in its domain (HFError naming the key, its value and what is valid)."""
    kind = params.get("rope_type")
    for key, value in params.items():
        domain, kinds = ROPE_VALUE_DOMAINS.get(key, (None, ()))
        if key == "factor" and kind in ("dynamic", "yarn", "llama3"):
            domain, kinds = SCALING_FACTOR, (kind,)
        if domain is None or kind not in kinds or value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not domain.test(value, params):
            raise HFError(f"{key!r} of rope_type {kind!r} must be {domain.describe(params)}, got {value!r}")


def rope_options(config: dict, override: dict | None = None) -> dict[str, Any]:
    """Our `rope` options for a checkpoint's rope parameters (`rope_parameters_of`), as HF transformers
    computes the inverse frequencies and attention factor of each rope_type."""
    params = rope_parameters_of(config, override)
    check_rope_values(params)
    try:
        return _rope_options(config, params)
    except KeyError as e:
        raise HFError(f"rope parameters of type {params['rope_type']!r} lack {e.args[0]!r}") from None


def _rope_options(config: dict, params: dict) -> dict[str, Any]:
    kind, factor = params["rope_type"], params.get("factor")
    max_length = config["max_position_embeddings"]
    original = params.get("original_max_position_embeddings") or config.get("original_max_position_embeddings") \
        or max_length
    options = {"base": float(params["rope_theta"]), "fraction": float(params.get("partial_rotary_factor", 1.0))}
    if kind == "default":
        return options
    if kind not in ROPE_TYPES:
        raise HFError(f"rope_type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    if kind == "linear":
        return {**options, "pi_factor": 1.0 / factor}
    if kind == "dynamic":  # HF scales from max_position_embeddings, not the original length
        return {**options, "dynamic_ntk": True, "dynamic_ntk_factor": float(factor), "original_length": max_length}
    factor = float(factor or max_length / original)
    if kind == "yarn":
        return {**options, **_yarn(params, factor), "original_length": original}
    if kind == "llama3":
        return {**options, "llama3_factor": factor, "llama3_low_freq_factor": float(params["low_freq_factor"]),
                "llama3_high_freq_factor": float(params["high_freq_factor"]), "original_length": original}
    return {**options, "longrope_short_factor": tuple(float(f) for f in params["short_factor"]),
            "longrope_long_factor": tuple(float(f) for f in params["long_factor"]), "longrope_factor": factor,
            "longrope_attention_factor": float(params.get("attention_factor") or 0.0), "original_length": original}


def _yarn(params: dict, factor: float) -> dict:
    """YaRN's options. HF's attention factor is 0.1 ln(s) + 1 (our yarn_temperature), or given
    (`attention_factor`, or mscale / mscale_all_dim); only 1 (temperature off) and the default are
    expressible. HF's `truncate` (default) rounds the correction range as our yarn_ramp="index"."""
    def mscale(m):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(m) / mscale(m_all) if m and m_all else mscale(1.0)
    if not params.get("truncate", True):
        raise HFError("yarn with truncate=false is not supported (rope.yarn_ramp='index' rounds the range)")
    temperature = not math.isclose(attention, 1.0)
    if temperature and not math.isclose(attention, mscale(1.0), rel_tol=1e-6):
        raise HFError(f"yarn attention factor {attention} is not supported: only 1 or 0.1 ln(factor) + 1 "
                      f"= {mscale(1.0)} (rope.yarn_temperature)")
    return {"yarn_scale": factor, "yarn_beta_fast": float(params.get("beta_fast") or 32.0),
            "yarn_beta_slow": float(params.get("beta_slow") or 1.0), "yarn_temperature": temperature}


def architecture_of(cfg: ModelConfig) -> str:
    """The HF architecture whose block `cfg` is (HFError where none is)."""
    neox = (cfg.norm == "layernorm" and cfg.mlp == "plain" and cfg.mlp_bias and cfg.qkv_bias == cfg.out_bias
            and cfg.kv_heads == cfg.num_heads)
    llama = cfg.norm == "rmsnorm" and cfg.mlp == "gated" and not cfg.parallel_residual
    if cfg.scale_embeddings or cfg.adaptive_cutoffs or cfg.qk_norm or cfg.post_norms or cfg.global_every \
            or not (neox or llama):
        raise HFError("this model's block is none of " + ", ".join(EXPORTABLE) + " (model.norm, model.mlp, "
                      "model.scale_embeddings, biases, Gemma 3's options); it cannot be exported")
    qwen = cfg.qkv_bias and not cfg.out_bias and not cfg.mlp_bias
    if cfg.attention_window and (neox or cfg.qkv_bias or cfg.out_bias or cfg.mlp_bias):
        raise HFError("a sliding window (model.attention_window) exports only as MistralForCausalLM: a Llama "
                      "block without biases")
    if neox:
        return "GPTNeoXForCausalLM"
    if cfg.attention_window:
        return "MistralForCausalLM"
    return "Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"


def hf_config(cfg: ModelConfig, max_length: int, rope: dict) -> dict:
    """config.json of a model with block `cfg` (the inverse of `model_config`), `rope` HF's rope
    parameters (rope_theta and partial_rotary_factor included)."""
    architecture = architecture_of(cfg)
    act = {ours: name for name, ours in reversed(ACTIVATIONS.items())}[cfg.activation]
    config = {"architectures": [architecture], "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
              "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
              "num_attention_heads": cfg.num_heads, "hidden_act": act, "max_position_embeddings": max_length,
              "tie_word_embeddings": cfg.tie_embeddings, "rope_parameters": rope, "rope_theta": rope["rope_theta"],
              "head_dim": cfg.head_size, "dtype": cfg.dtype}
    if architecture == "GPTNeoXForCausalLM":
        return {**config, "model_type": "gpt_neox", "layer_norm_eps": cfg.norm_eps, "attention_bias": cfg.qkv_bias,
                "use_parallel_residual": cfg.parallel_residual,
                "rotary_pct": rope.get("partial_rotary_factor", 1.0)}
    model_type = {"Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}.get(architecture, "llama")
    window = {"sliding_window": cfg.attention_window} if architecture == "MistralForCausalLM" else {}
    return {**config, "model_type": model_type, "rms_norm_eps": cfg.norm_eps, "num_key_value_heads": cfg.kv_heads,
            "attention_bias": cfg.qkv_bias, "mlp_bias": cfg.mlp_bias, **window}
