"""The table of checkpoint architectures (models/formats/architectures.py): every row reads its
config.json into a block whose every parameter its weight table maps, exports that block as itself
(or refuses, where the row has no export), and names GGUF tensors gguf's tables know; and a new
architecture whose block the decoder has is one row: loaded from and exported to a Hugging Face
folder, and read from a GGUF file, with no other change."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

import posenc
from models import DecoderLM
from models.config import ModelConfig
from models.formats import hf
from models.formats.architectures import ARCHITECTURES, LLAMA_WEIGHTS, Architecture, GGUFForm, MetadataKey
from models.formats.hf_mapping import (RULES, Heads, HFError, architecture, architecture_of, hf_config, model_config,
                                       rows)
from tests.gguf_files import hf_folder, write
from tests.models.test_gemma3 import gemma3_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_tiny"


def sample(name: str) -> dict:
    """A tiny config.json of each row (a new row adds its own)."""
    if name == "gemma3":
        return gemma3_config()
    return json.loads((FIXTURES / name.replace("-", "_") / "config.json").read_text())


def parameter_shapes(cfg: ModelConfig) -> dict:
    model = nnx.eval_shape(lambda: DecoderLM(cfg, posenc.default_config("rope"), 64, rngs=nnx.Rngs(0)))
    return {".".join(map(str, k)): v.get_value() for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_names_are_unique():
    assert len({row.hf_name for row in ARCHITECTURES.values()}) == len(ARCHITECTURES)
    names = [row.gguf.name for row in ARCHITECTURES.values() if row.gguf]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_parameter_of_the_rows_block_is_in_its_weight_table(name):
    row, config = ARCHITECTURES[name], sample(name)
    assert architecture(config) is row
    cfg = model_config(config, "float32")
    table = {ours: (names, rule) for names, ours, rule in rows(row, cfg.num_layers)}
    assert all(rule in RULES for _, rule in table.values())
    params = parameter_shapes(cfg)
    assert set(params) <= set(table), f"{name}: no weight-table row for {sorted(set(params) - set(table))}"


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_the_row_exports_its_block_as_itself_or_refuses(name):
    row, cfg = ARCHITECTURES[name], model_config(sample(name), "float32")
    if row.to_config is None:
        with pytest.raises(HFError, match="cannot be exported"):
            architecture_of(cfg)
        return
    assert architecture_of(cfg) is row
    config = hf_config(cfg, 64, {"rope_type": "default", "rope_theta": 1e4})
    assert config["architectures"] == [row.hf_name] and config["model_type"] == row.model_type
    assert model_config(config, "float32") == cfg


@pytest.mark.parametrize("name", [name for name, row in ARCHITECTURES.items() if row.gguf])
def test_the_rows_gguf_form_names_tensors_gguf_knows(name):
    row, cfg = ARCHITECTURES[name], model_config(sample(name), "float32")
    assert row.gguf.name in gguf.MODEL_ARCH_NAMES.values()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[row.gguf.name.upper()], cfg.num_layers)
    params = parameter_shapes(cfg)
    for hf_names, ours, _ in rows(row, cfg.num_layers):
        if ours in params:
            assert all(names.get_name(n, try_suffixes=(".weight", ".bias")) for n in hf_names), (name, hf_names)


# ---- a new architecture: one row ------------------------------------------------------------------

def toy_block(config: dict, head_dim: int) -> dict:
    """LayerNorm with biases, a gated MLP, grouped-query attention, biases on q/k/v only."""
    return dict(norm="layernorm", norm_eps=config.get("layer_norm_eps", 1e-5), mlp="gated",
                num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
                qkv_bias=bool(config.get("attention_bias", False)), out_bias=False, mlp_bias=False)


def toy_keys(cfg: ModelConfig, rope: dict) -> dict:
    return {"layer_norm_eps": cfg.norm_eps, "num_key_value_heads": cfg.kv_heads, "attention_bias": cfg.qkv_bias}


_NORM_BIASES = tuple(((names[0].replace(".weight", ".bias"),), ours.replace(".scale", ".bias"), "copy")
                     for names, ours, _ in LLAMA_WEIGHTS if ours.endswith(".scale"))
# its GGUF form: an architecture gguf's tables know and the project has no row for
TOY_GGUF = GGUFForm("stablelm", keys=(MetadataKey("attention.layer_norm_epsilon", "layer_norm_eps", 1e-5),))
TOY = Architecture("ToyLMForCausalLM", "toy_lm", toy_block, LLAMA_WEIGHTS + _NORM_BIASES, toy_keys, gguf=TOY_GGUF)
TOY_CFG = ModelConfig(vocab_size=40, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=48,
                      activation="silu", norm="layernorm", norm_eps=1e-5, mlp="gated", qkv_bias=True,
                      out_bias=False, mlp_bias=False, scale_embeddings=False, tie_embeddings=False)


def toy_checkpoint(folder: Path) -> tuple[dict, dict]:
    """A Hugging Face folder of TOY_CFG written through the row (its config keys, its weight table),
    random tensors in every parameter's place (no zero bias); returns (config.json, tensors)."""
    shapes, heads, rng = parameter_shapes(TOY_CFG), Heads.of(TOY_CFG), np.random.default_rng(0)
    tensors = {}
    for names, ours, rule in rows(TOY, TOY_CFG.num_layers):
        if ours in shapes:
            specs = jax.eval_shape(lambda x: RULES[rule].to_hf(x, heads), shapes[ours])
            tensors.update({n: (0.2 * rng.standard_normal(s.shape)).astype(np.float32) for n, s in zip(names, specs)})
    config = hf_config(TOY_CFG, 32, {"rope_type": "default", "rope_theta": 1e4})
    hf_folder(folder, config, tensors)
    return config, tensors


def test_a_new_architecture_is_one_row(monkeypatch, tmp_path):
    """Read from a Hugging Face folder, exported back tensor for tensor, and read from a GGUF file
    as llama.cpp would write it into the same parameters, through the made-up row alone (the
    forward pass of such a block is the decoder's, tested with every real architecture)."""
    monkeypatch.setitem(ARCHITECTURES, "toy", TOY)
    assert architecture_of(TOY_CFG) is TOY
    config, tensors = toy_checkpoint(tmp_path / "toy")
    assert config["architectures"] == ["ToyLMForCausalLM"] and "model.layers.1.input_layernorm.bias" in tensors
    from_hf, _ = hf.load(tmp_path / "toy")
    assert from_hf.cfg == TOY_CFG

    exported = load_file(hf.export(from_hf, tmp_path / "exported") / "model.safetensors")
    assert sorted(exported) == sorted(tensors)
    for name, tensor in tensors.items():
        np.testing.assert_array_equal(exported[name], tensor, err_msg=name)

    write(tmp_path / "toy.gguf", "stablelm", config, tensors)
    from_gguf, _ = hf.load(tmp_path / "toy.gguf")
    assert from_gguf.cfg == TOY_CFG
    ours, theirs = hf.params_by_path(from_hf), hf.params_by_path(from_gguf)
    assert sorted(ours) == sorted(theirs)
    for path, value in ours.items():
        np.testing.assert_array_equal(theirs[path], value, err_msg=path)


def test_without_its_row_the_architecture_is_refused_by_name(tmp_path):
    with pytest.raises(HFError, match="cannot be exported"):
        architecture_of(TOY_CFG)
    config = {**sample("llama"), "architectures": ["ToyLMForCausalLM"]}
    with pytest.raises(HFError, match="architecture ToyLMForCausalLM is not supported; supported: LlamaForCausalLM"):
        model_config(config, "float32")
