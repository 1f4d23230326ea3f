"""What a Hugging Face checkpoint is in this project's terms: its config.json as a ModelConfig and
`rope` options, and its tensors as our parameters (each architecture's weight table, read both
ways, so that hf.py loads and exports with the same rows). What differs between architectures is
their rows in architectures.py; nothing here names one.

A weight-table row is (HF tensor names, our parameter path, rule); `{i}` stands for the layer index.
A row applies where our model has that parameter (the untied output projection, the biases the
config switches on), so one table serves every variant of its family. Rules (`RULES`), with
H query heads, G key/value heads and K features per head:

  copy     the same array (embeddings, norm scales and biases, output-projection biases)
  linear   transposed: HF's nn.Linear weight is out x in, our kernel in x out
  qkv      q, k, v (H*K, G*K, G*K rows) concatenated along the output, then transposed (if 2-d)
  neox     GPT-NeoX's fused query_key_value, laid out per head as [q_h, k_h, v_h] (3*K rows each):
           regrouped into all q, all k, all v, then transposed (if 2-d)
  gemma_norm  Gemma's RMSNorm scale: HF's weight w multiplies by 1 + w, ours by its scale
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp

from models.config import ModelConfig
from models.formats import HFError
from models.formats.architectures import ARCHITECTURES, Architecture, by_hf_name
from posenc.domains import above, at_least, between, positive
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

def architecture(config: dict, where: str = "config.json") -> Architecture:
    """The row of ARCHITECTURES that config.json's `architectures[0]` names (HFError if none)."""
    return by_hf_name((config.get("architectures") or ["(none)"])[0], where)


def rows(architecture: Architecture, num_layers: int):
    """Its weight table's rows with `{i}` filled in: (HF names, our path, rule), layer rows once per layer."""
    for names, ours, rule in architecture.weights:
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
    architecture(config, str(path))
    return config


def unapplied_window(config: dict) -> int:
    """A sliding window the decoder does not apply (0: none; Qwen2's, which holds only from layer
    `max_window_layers` on): such a model is exact only up to the window (hf.py warns at load)."""
    found = architecture(config).unapplied_window
    return found(config) if found else 0


def model_config(config: dict, dtype: str) -> ModelConfig:
    """The ModelConfig of a HF config.json: the shape every architecture gives alike, and the block
    options as its row of ARCHITECTURES reads them."""
    row = architecture(config)
    act = next((config[key] for key in row.activation_keys if config.get(key)), row.activation)
    if act not in ACTIVATIONS:
        raise HFError(f"config.json: hidden_act {act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    heads, d_model = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or d_model // heads
    common = dict(vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"], d_model=d_model,
                  num_heads=heads, mlp_dim=config["intermediate_size"], activation=ACTIVATIONS[act],
                  tie_embeddings=bool(config.get("tie_word_embeddings", False)), dtype=dtype,
                  head_dim=0 if head_dim * heads == d_model else head_dim, scale_embeddings=False)
    cfg = ModelConfig(**{**common, **row.block(config, head_dim)})
    try:
        cfg.check_block()
    except ValueError as e:
        raise HFError(f"config.json: {e}") from None
    return cfg


def rope_parameters_of(config: dict, override: dict | None = None) -> dict:
    """HF's rope parameters in their current form: config.json's `rope_parameters` (or the older
    `rope_scaling`, `type` read as `rope_type`), `override` in their place where given; rope_theta
    and partial_rotary_factor from the checkpoint where the chosen dict has none."""
    if override is not None:
        check_written_rope(override)
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


# The keys of each rope_type that transformers reads (its rope initialisers), besides rope_type, rope_theta
# and partial_rotary_factor: a dict a user writes (import_hf.py --rope_parameters) holds no other.
ROPE_KEYS = {"default": (), "linear": ("factor",), "dynamic": ("factor", "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                      "mscale", "mscale_all_dim", "truncate"),
             "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
             "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings",
                          "attention_factor")}


def check_written_rope(params: dict) -> None:
    """A rope dict given in place of the checkpoint's: it names its rope_type (a dict without one would be
    read as plain RoPE, its factor ignored), and holds only that type's keys (a misspelt key is an
    option silently not applied)."""
    kind = params.get("rope_type", params.get("type"))
    if kind is None:
        raise HFError(f"no rope_type in {json.dumps(params)}: name the scaling, e.g. "
                      f"{{\"rope_type\": \"yarn\", \"factor\": 4}}; types: {', '.join(ROPE_KEYS)}")
    if kind not in ROPE_KEYS:
        raise HFError(f"rope_type {kind!r} is not supported; supported: {', '.join(ROPE_KEYS)}")
    known = {"rope_type", "type", "rope_theta", "partial_rotary_factor", *ROPE_KEYS[kind]}
    unknown = sorted(set(params) - known)
    if unknown:
        keys = ", ".join(sorted(known - {"type"}))
        raise HFError(f"{unknown[0]!r} is not a key of rope_type {kind!r}; its keys: {keys}")


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
# The keys each rope_type must have, as transformers' validation of the dict requires them.
ROPE_REQUIRED_KEYS = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
                      "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
                      "longrope": ("short_factor", "long_factor")}


def check_rope_values(params: dict) -> None:
    """Each key its rope_type requires is there, and each number of HF's rope dict is in its domain
    (HFError naming the missing key, or the key, its value and what is valid)."""
    kind = params.get("rope_type")
    missing = [key for key in ROPE_REQUIRED_KEYS.get(kind, ()) if params.get(key) is None]
    if missing:
        raise HFError(f"rope_type {kind!r} lacks {', '.join(map(repr, missing))}, which transformers requires "
                      f"for it (required: {', '.join(ROPE_REQUIRED_KEYS[kind])}); add it to the dict")
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


# ModelConfig's options that no checkpoint holds (training and evaluation choices): export ignores them
NOT_IN_CHECKPOINTS = ("dropout", "attention_dropout", "activation_dropout", "adaptive_factor",
                      "adaptive_tail_capacity", "attention", "attention_block", "attention_check", "attention_sinks",
                      "attention_sink_distance", "dtype")


def _block(cfg: ModelConfig) -> dict:
    """The options of `cfg` that a checkpoint holds, the defaulted ones resolved (kv heads, head size)."""
    block = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in NOT_IN_CHECKPOINTS}
    return {**block, "num_kv_heads": cfg.kv_heads, "head_dim": cfg.head_size}


def _config_as(row: Architecture, cfg: ModelConfig, max_length: int, rope: dict) -> dict:
    """config.json of block `cfg` written as `row` writes it."""
    act = {ours: name for name, ours in reversed(ACTIVATIONS.items())}[cfg.activation]
    config = {"architectures": [row.hf_name], "model_type": row.model_type, "vocab_size": cfg.vocab_size,
              "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
              "num_attention_heads": cfg.num_heads, "hidden_act": act, "max_position_embeddings": max_length,
              "tie_word_embeddings": cfg.tie_embeddings, "rope_parameters": rope, "rope_theta": rope["rope_theta"],
              "head_dim": cfg.head_size, "dtype": cfg.dtype}
    return {**config, **row.to_config(cfg, rope)}


def _differences(row: Architecture, cfg: ModelConfig) -> dict[str, tuple] | None:
    """{option: (ours, as `row` reads it back)} where writing `cfg` as `row` and reading it back does
    not give `cfg`'s block; None where `row` refuses what it wrote."""
    try:
        back = model_config(_config_as(row, cfg, 1, {"rope_theta": 1e4}), cfg.dtype)
    except HFError:
        return None
    ours, theirs = _block(cfg), _block(back)
    return {key: (ours[key], theirs[key]) for key in ours if ours[key] != theirs[key]}


def architecture_of(cfg: ModelConfig) -> Architecture:
    """The row of ARCHITECTURES that exports block `cfg`: the first whose config.json conversions, one
    way and back, give the block unchanged (HFError naming the nearest row's differences if none)."""
    exportable = [row for row in ARCHITECTURES.values() if row.to_config is not None]
    found = {row.hf_name: _differences(row, cfg) for row in exportable}
    for row in exportable:
        if found[row.hf_name] == {}:
            return row
    message = f"this model's block is none of {', '.join(found)}; it cannot be exported"
    near = sorted((len(differ), name) for name, differ in found.items() if differ is not None)
    if near:
        differ = found[near[0][1]].items()
        message += f" (the nearest, {near[0][1]}, has " + ", ".join(
            f"model.{key}={theirs!r} where this model has {ours!r}" for key, (ours, theirs) in differ) + ")"
    raise HFError(message)


def hf_config(cfg: ModelConfig, max_length: int, rope: dict) -> dict:
    """config.json of a model with block `cfg` (the inverse of `model_config`), `rope` HF's rope
    parameters (rope_theta and partial_rotary_factor included)."""
    return _config_as(architecture_of(cfg), cfg, max_length, rope)
