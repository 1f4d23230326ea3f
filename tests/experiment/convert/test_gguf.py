"""A GGUF file through import_hf (experiment/convert/hf.py) and import_hf.py: the run gives the logits
transformers computed for the same tensors and exports back to HF's format; each bad file (truncated,
not GGUF, a tensor type gguf does not read, an unsupported architecture, no tokenizer) is one line
naming the file, with nothing left where the run would have gone."""
from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from experiment.evals.common import load_checkpoint
from experiment.convert.hf import export_hf, import_hf
from experiment.store.run import RunDir
from models.formats import hf
from models.formats.hf_mapping import HFError
from tests.conftest import run_entry
from tests.gguf_files import HF_TINY, Q, hf_tiny, write


def stored(arch: str, case: str):
    data = np.load(HF_TINY / arch / "logits.npz")
    return data[f"{case}_ids"], data[f"{case}_logits"]


def run_logits(workdir: Path, ids) -> np.ndarray:
    run = RunDir(workdir)
    scoring = load_checkpoint(run, run.load_config(), [256], {})
    return np.asarray(scoring.model()(jnp.asarray(ids)[None])[0])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_imported_gguf_run_gives_transformers_logits_and_exports(tmp_path, arch):
    config, tensors = hf_tiny(arch)
    write(tmp_path / "m.gguf", arch, config, tensors)
    run = import_hf(tmp_path / "m.gguf", tmp_path / "run")
    c = run.load_config()
    assert c.train.seq_len == 64 and c.data.tokenizer == "pretrained" and c.posenc.name == "rope"
    tokenizer = json.loads(run.tokenizer_path.read_text())
    assert tokenizer["kind"] == "pretrained" and tokenizer["eos_id"] == 2 and tokenizer["vocab_size"] == 320
    ids, expected = stored(arch, "default")
    np.testing.assert_allclose(run_logits(run.path, ids), expected, atol=1e-4, rtol=0)
    exported = export_hf(run.path, tmp_path / "exported")
    assert json.loads((exported / "config.json").read_text())["architectures"] == [hf_tiny(arch)[0]["architectures"][0]]
    model, exported_tokenizer = hf.load(exported)
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids)[None])[0]), expected, atol=1e-4, rtol=0)
    text = json.loads((HF_TINY / "llama" / "tokenized.json").read_text())["text"]
    assert exported_tokenizer.encode(text).ids[:256] == ids.tolist()


def _set_tensor_type(path: Path, name: str, number: int) -> None:
    """Overwrite the type of tensor `name` in the file's tensor list (after its name, dimension count
    and dimensions) with `number`."""
    data = bytearray(path.read_bytes())
    at = data.index(name.encode()) + len(name)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    at += 4 + 8 * n_dims
    data[at:at + 4] = number.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def bad_file(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A GGUF file with the defect `case`, and a word its refusal must contain."""
    path = tmp_path / f"{case}.gguf"
    config, tensors = hf_tiny("llama")
    if case == "not_gguf":
        path.write_text("this is a text file, not a model\n")
        return path, "not a GGUF file"
    if case == "architecture":
        write(path, "falcon", config, {})
        return path, "'falcon' is not supported; supported: llama, qwen2"
    write(path, "llama", config, tensors, tokenizer=case != "no_tokenizer")
    if case == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path, "truncated"
    if case == "unknown_type":
        _set_tensor_type(path, "blk.0.ffn_up.weight", 99)
        return path, "type number 99"
    if case == "unreadable_type":
        _set_tensor_type(path, "blk.0.ffn_up.weight", int(Q.I32))
        return path, "blk.0.ffn_up.weight has type I32"
    return path, "no tokenizer metadata"


CASES = ["truncated", "not_gguf", "unknown_type", "unreadable_type", "architecture", "no_tokenizer"]


@pytest.mark.parametrize("case", CASES)
def test_bad_gguf_is_one_line_and_leaves_nothing(tmp_path, case):
    path, words = bad_file(tmp_path, case)
    with pytest.raises(HFError) as error:
        hf.load(path)
    message = str(error.value)
    assert words in message and str(path) in message and "\n" not in message, message
    with pytest.raises(HFError):
        import_hf(path, tmp_path / "runs" / "run")
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_import_hf_py_refuses_a_bad_gguf_in_one_line(tmp_path):
    path, words = bad_file(tmp_path, "truncated")
    result = run_entry("import_hf.py", str(path), "--workdir", str(tmp_path / "run"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0] and str(path) in lines[0], result.stderr
    assert not (tmp_path / "run").exists()


def test_extend_takes_an_imported_gguf_run_as_its_base(tmp_path):
    """configs/extend.py:METHOD,RUN on a run imported from a GGUF file: the window, tokenizer and
    block come from the file, and the checkpoint's parameters fit the fine-tune's model."""
    from flax import nnx

    from experiment import config as config_lib
    from experiment.model import abstract_model
    from experiment.train import init_from
    from tests.experiment.convert.test_hf_finetune import extend_config
    config, tensors = hf_tiny("llama")
    write(tmp_path / "m.gguf", "llama", config, tensors)
    run = import_hf(tmp_path / "m.gguf", tmp_path / "run")
    c = config_lib.resolve(extend_config("yarn", run.path))
    assert c.train.seq_len == 256 and c.data.tokenizer == "pretrained" and c.model.num_kv_heads == 2
    assert (c.posenc.rope.yarn_scale, c.posenc.rope.original_length) == (4.0, 64)
    target = nnx.split(abstract_model(c, 320))[1]
    _, origin = init_from.load_base_params(c, init_from.base_of(c), target, 320)
    assert origin["step"] == 0 and origin["train_length"] == 64
