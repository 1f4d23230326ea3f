"""models/formats/hf.py against tiny Hugging Face checkpoints and the logits transformers computes for them
(tests/fixtures/hf_tiny/README.md): every architecture and rope type, the tokenizer, the refusals,
bfloat16, sharded checkpoints."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

import posenc
from models.formats import hf
from models.formats.hf_mapping import rope_options
from posenc.rope_scaling import RopeOptions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_tiny"
ROPE_PARAMETERS = json.loads((FIXTURES / "llama" / "rope_parameters.json").read_text())
CASES = [("llama", case) for case in ROPE_PARAMETERS] + [("qwen2", "default"), ("gpt_neox", "default")]


def reference(arch: str, case: str):
    stored = np.load(FIXTURES / arch / "logits.npz")
    return stored[f"{case}_ids"], stored[f"{case}_logits"]


def logits(model, ids) -> np.ndarray:
    return np.asarray(model(jnp.asarray(ids)[None])[0])


@pytest.mark.parametrize("arch,case", CASES, ids=[f"{a}-{c}" for a, c in CASES])
def test_logits_equal_transformers(arch, case):
    model, _ = hf.load(FIXTURES / arch, rope_parameters=ROPE_PARAMETERS[case] if arch == "llama" else None)
    ids, expected = reference(arch, case)
    out = logits(model, ids)
    print(f"{arch}/{case}: largest absolute logit difference {np.abs(out - expected).max():.3g}")
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=0)


def test_mistral_sliding_window_gives_transformers_logits_and_exports(tmp_path):
    """mistral/: llama's weights as MistralForCausalLM with sliding_window=16, and transformers' logits
    for 256 tokens (which differ from llama's beyond the window): model.attention_window."""
    folder = tmp_path / "mistral"
    shutil.copytree(FIXTURES / "mistral", folder)
    shutil.copyfile(FIXTURES / "llama" / "model.safetensors", folder / "model.safetensors")
    model, _ = hf.load(folder)
    assert model.cfg.attention_window == 16
    ids, expected = reference("mistral", "default")
    out = logits(model, ids)
    print(f"mistral/default: largest absolute logit difference {np.abs(out - expected).max():.3g}")
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=0)
    exported = hf.export(model, tmp_path / "exported")
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"] and config["sliding_window"] == 16
    np.testing.assert_array_equal(logits(hf.load(exported)[0], ids), out)


def test_qwen2_sliding_window_is_named_at_load(tmp_path, caplog):
    """Qwen2's window (use_sliding_window, from layer max_window_layers on) is not applied: a warning."""
    folder = variant(tmp_path, "qwen2")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "use_sliding_window": True, "sliding_window": 32}))
    with caplog.at_level("WARNING"):
        hf.load(folder)
    assert any("sliding_window=32" in r.getMessage() and "exact only up to 32" in r.getMessage()
               for r in caplog.records)


def test_inverse_frequencies_equal_transformers_bit_for_bit():
    """inverse_frequencies.json: transformers' own default, llama3 and longrope frequencies (rotary dim
    up to 128, theta up to 500000: Llama 3's sizes), which our rope options give to the last bit."""
    stored = json.loads((FIXTURES / "inverse_frequencies.json").read_text())
    for case in stored["cases"]:
        options = RopeOptions(**rope_options({"max_position_embeddings": 256}, case["rope_parameters"]))
        got = posenc.scaled_inverse_frequencies(options, case["rotary_dim"], options.original_length or 256,
                                                case.get("seq_len"))
        np.testing.assert_array_equal(np.asarray(got), np.float32(case["inv_freq"]), err_msg=str(case["rope_parameters"]))


def test_tokenizer_encodes_the_text_to_its_ids():
    """tokenized.json holds the text and the first 256 of its ids (the logits' input)."""
    _, tokenizer = hf.load(FIXTURES / "llama")
    tokenized = json.loads((FIXTURES / "llama" / "tokenized.json").read_text())
    ids = tokenizer.encode(tokenized["text"]).ids
    assert len(ids) > 256 and ids[:256] == tokenized["ids"] == reference("llama", "default")[0].tolist()


def test_a_folder_without_tokenizer_gives_none():
    assert hf.load(FIXTURES / "qwen2")[1] is None


def test_older_rope_scaling_key_and_top_level_rope_theta(tmp_path):
    """config.json as transformers 4 wrote it: `rope_scaling` with `type`, `rope_theta` beside it."""
    folder = variant(tmp_path, "llama")
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters")
    config.update(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 4.0})
    (folder / "config.json").write_text(json.dumps(config))
    ids, expected = reference("llama", "linear")
    np.testing.assert_allclose(logits(hf.load(folder)[0], ids), expected, atol=1e-4, rtol=0)


def test_rope_types_map_onto_rope_options():
    config = json.loads((FIXTURES / "llama" / "config.json").read_text())
    assert rope_options(config, {"rope_type": "linear", "factor": 4})["pi_factor"] == 0.25
    dynamic = rope_options(config, {"rope_type": "dynamic", "factor": 2})
    assert dynamic["dynamic_ntk"] and dynamic["original_length"] == 64
    same_mscales = {"rope_type": "yarn", "factor": 4, "mscale": 1, "mscale_all_dim": 1}
    assert rope_options(config, same_mscales)["yarn_temperature"] is False  # attention factor 1
    neox = json.loads((FIXTURES / "gpt_neox" / "config.json").read_text())
    assert rope_options(neox)["fraction"] == 0.25
    for refused in ({"rope_type": "su"}, {"rope_type": "yarn", "factor": 4, "attention_factor": 2.0}):
        with pytest.raises(hf.HFError) as error:
            rope_options(config, refused)
        assert "\n" not in str(error.value)


def variant(tmp_path: Path, arch: str, change=None, dtype=None) -> Path:
    """A copy of a fixture checkpoint, its tensors passed through `change` (name -> array dict)."""
    folder = tmp_path / arch
    shutil.copytree(FIXTURES / arch, folder)
    if change is not None or dtype is not None:
        tensors = load_file(folder / "model.safetensors")
        tensors = change(tensors) if change is not None else tensors
        save_file({k: v.astype(dtype or v.dtype) for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


def refusal(path, match: str, **kwargs) -> str:
    with pytest.raises(hf.HFError, match=match) as error:
        hf.load(path, **kwargs)
    message = str(error.value)
    assert "\n" not in message and isinstance(error.value, ValueError)
    return message


@pytest.mark.parametrize("rope, expected", [
    ({"rope_type": "yarn", "factor": -4}, "'factor' of rope_type 'yarn' must be >= 1 (L_target / L_train), got -4"),
    ({"rope_type": "linear", "factor": 0}, "'factor' of rope_type 'linear' must be > 0, got 0"),  # was ZeroDivisionError
    ({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 2,
      "original_max_position_embeddings": 32}, "'high_freq_factor' of rope_type 'llama3' must be > low_freq_factor"),
    ({"rope_type": "linear"}, "rope_type 'linear' lacks 'factor', which transformers requires for it"),  # issue 45
    ({"rope_type": "dynamic"}, "rope_type 'dynamic' lacks 'factor'"),  # both were a TypeError traceback
    ({"rope_type": "llama3", "factor": 8}, "rope_type 'llama3' lacks 'original_max_position_embeddings', "
     "'low_freq_factor', 'high_freq_factor', which transformers requires")],
    ids=["yarn", "linear", "llama3", "linear-no-factor", "dynamic-no-factor", "llama3-incomplete"])
def test_bad_rope_parameters_blame_the_rope_parameters_given_not_the_checkpoint(rope, expected):
    """Issue 32: --rope_parameters '{"rope_type":"yarn","factor":-4}' blamed the checkpoint's
    config.json and an option the user did not write (posenc.rope.yarn_scale)."""
    with pytest.raises(hf.HFError) as error:
        hf.load_checkpoint(FIXTURES / "llama", rope_parameters=rope)
    message = str(error.value)
    assert message.startswith(f"rope_parameters {json.dumps(rope)} (import_hf.py --rope_parameters): {expected}")
    assert "config.json" not in message and "posenc." not in message


def test_unsupported_architecture_is_refused(tmp_path):
    folder = variant(tmp_path, "qwen2")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    message = refusal(folder, "BertForMaskedLM")
    assert all(row.hf_name in message for row in hf.ARCHITECTURES.values())


def test_missing_tensor_is_named(tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    folder = variant(tmp_path, "llama", lambda t: {k: v for k, v in t.items() if k != name})
    refusal(folder, f"tensor {name} is missing")


def test_shape_mismatch_names_tensor_expected_and_got(tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    folder = variant(tmp_path, "llama", lambda t: {**t, name: t[name][:32]})
    refusal(folder, rf"{name} has shape \(32, 128\), expected \(64, 128\)")


def test_truncated_file_is_refused(tmp_path):
    folder = variant(tmp_path, "qwen2")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    refusal(folder, "truncated or corrupt")


def test_unreachable_hub_id_is_one_line(tmp_path, monkeypatch):
    import huggingface_hub
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    refusal("nobody-here/tiny-llama",
            "nobody-here/tiny-llama: no such local folder, and it cannot be fetched from the Hugging Face hub")

    def unreachable(*args, **kwargs):
        raise ConnectionError("Max retries exceeded\nwith url: https://huggingface.co/...")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    refusal("nobody-here/tiny-llama", "ConnectionError: Max retries exceeded")
    refusal(tmp_path / "no-such-folder", "no-such-folder: no such file or folder")
    (tmp_path / "file.txt").write_text("x")
    refusal(tmp_path / "file.txt", "not a GGUF file")


def params(model) -> dict:
    return {".".join(map(str, k)): v.get_value() for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_bfloat16_checkpoint_loads_as_bfloat16(tmp_path):
    folder = variant(tmp_path, "llama", dtype=ml_dtypes.bfloat16)
    model, _ = hf.load(folder, dtype="bfloat16")
    loaded = params(model)
    assert {v.dtype for v in loaded.values()} == {jnp.dtype(jnp.bfloat16)}
    stored = load_file(folder / "model.safetensors")
    np.testing.assert_array_equal(loaded["blocks.0.gate.kernel"], stored["model.layers.0.mlp.gate_proj.weight"].T)
    ids, expected = reference("llama", "default")
    out = logits(model, ids)
    assert out.dtype == np.float32 and np.corrcoef(out.ravel(), expected.ravel())[0, 1] > 0.99
    as_float32 = params(hf.load(folder)[0])  # the same bfloat16 tensors, upcast
    assert as_float32["embed.embedding"].dtype == jnp.float32


def test_sharded_checkpoint_equals_the_single_file(tmp_path):
    folder = variant(tmp_path, "gpt_neox")
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({k: tensors[k] for k in part}, folder / file)
    weight_map = {k: file for file, part in shards.items() for k in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    ids, expected = reference("gpt_neox", "default")
    np.testing.assert_allclose(logits(hf.load(folder)[0], ids), expected, atol=1e-4, rtol=0)


def test_loaded_model_is_a_decoder_lm_that_jits():
    model, _ = hf.load(FIXTURES / "qwen2")
    graphdef, state = nnx.split(model)
    ids, expected = reference("qwen2", "default")
    out = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, jnp.asarray(ids)[None])
    np.testing.assert_allclose(out[0], expected, atol=1e-4, rtol=0)
    assert model.cfg.tie_embeddings and model.cfg.qkv_bias and not model.cfg.out_bias


@pytest.mark.parametrize("arch,case", [("llama", "yarn"), ("qwen2", "default"), ("gpt_neox", "default")])
def test_export_round_trip(tmp_path, arch, case):
    """load -> export -> load gives the same logits, and the exported tensors are the originals."""
    rope = ROPE_PARAMETERS[case] if arch == "llama" else None
    model, _ = hf.load(FIXTURES / arch, rope_parameters=rope)
    out = hf.export(model, tmp_path / "out", rope)
    original, exported = load_file(FIXTURES / arch / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        np.testing.assert_array_equal(exported[name], tensor, err_msg=name)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == json.loads((FIXTURES / arch / "config.json").read_text())["architectures"]
    ids, expected = reference(arch, case)
    np.testing.assert_array_equal(logits(hf.load(out)[0], ids), logits(model, ids))


def test_export_refuses_a_block_without_hf_form(tmp_path):
    import posenc
    from models import DecoderLM
    from models.config import ModelConfig
    model = DecoderLM(ModelConfig(vocab_size=37, num_layers=1, d_model=32, num_heads=4, mlp_dim=64),
                      posenc.default_config("rope"), 16, rngs=nnx.Rngs(0))
    with pytest.raises(hf.HFError, match="cannot be exported"):
        hf.export(model, tmp_path)
