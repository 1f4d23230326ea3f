"""experiment/convert/hf.py and import_hf.py / export_hf.py: a Hugging Face checkpoint as a run
directory (the stored transformers logits, evaluated as any run is), refusals that leave nothing
behind, and the run exported back to HF's format."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import corpora
from experiment.convert.hf import export_hf, hf_rope_parameters, import_hf
from experiment.evals import evaluate
from experiment.evals.common import load_checkpoint
from experiment.store import checkpoints
from experiment.store.run import RunDir, RunError
from models.formats import hf
from models.formats.hf_mapping import HFError
from tests.conftest import REPO, run_entry
from tests.experiment.report.synthetic import fake_run

FIXTURES = REPO / "tests" / "fixtures" / "hf_tiny"
ROPE_PARAMETERS = json.loads((FIXTURES / "llama" / "rope_parameters.json").read_text())


def checkpoint(tmp_path: Path, arch: str, change=None) -> Path:
    """A copy of a fixture with a tokenizer (qwen2 and gpt_neox have none: llama's, same vocabulary;
    qwen2 has no eos_token_id: 2), its tensors passed through `change`."""
    folder = tmp_path / f"src_{arch}"
    shutil.copytree(FIXTURES / arch, folder)
    if not (folder / "tokenizer.json").exists():
        shutil.copyfile(FIXTURES / "llama" / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    if config.get("eos_token_id") is None:
        (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 2}))
    if change is not None:
        save_file(change(load_file(folder / "model.safetensors")), folder / "model.safetensors")
    return folder


def local_corpus(root: Path, lines: int = 300) -> Path:
    """ROOT/corpus: train, valid and test files of `lines` short English lines (a local data source)."""
    corpus = root / "corpus"
    corpus.mkdir()
    text = "\n".join(f"line {i} of a small corpus about tokens, windows and positions." for i in range(lines))
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text(text + "\n")
    return corpus


def stored(arch: str, case: str):
    data = np.load(FIXTURES / arch / "logits.npz")
    return data[f"{case}_ids"], data[f"{case}_logits"]


def run_logits(workdir: Path, ids) -> np.ndarray:
    """The logits of the model built from the run exactly as evaluation builds it."""
    run = RunDir(workdir)
    scoring = load_checkpoint(run, run.load_config(), [256], {})
    assert scoring.tokenizer.vocab_size == 320 and scoring.step == 0
    return np.asarray(scoring.model()(jnp.asarray(ids)[None])[0])


CASES = [("llama", "default"), ("qwen2", "default"), ("gpt_neox", "default"), ("llama", "yarn"),
         ("llama", "llama3")]


@pytest.mark.parametrize("arch,case", CASES, ids=[f"{a}-{c}" for a, c in CASES])
def test_imported_run_gives_the_stored_logits(tmp_path, arch, case):
    rope = ROPE_PARAMETERS[case] if case != "default" else None
    import_hf(checkpoint(tmp_path, arch), tmp_path / "run", rope_parameters=rope)
    config = RunDir(tmp_path / "run").load_config()
    assert config.train.seq_len == 64 and config.data.tokenizer == "pretrained" and config.posenc.name == "rope"
    ids, expected = stored(arch, case)
    out = run_logits(tmp_path / "run", ids)
    print(f"{arch}/{case}: largest absolute logit difference {np.abs(out - expected).max():.3g}")
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=0)


def test_run_directory_holds_config_tokenizer_and_step_0(tmp_path):
    run = import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run")
    assert sorted(p.name for p in run.path.iterdir()) == ["checkpoints", "config.json", "special_tokens_map.json",
                                                          "tokenizer.json"]  # the fixture's bos_token_id 1 kept
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left
    import jax
    from flax import nnx
    from experiment.model import abstract_model
    from experiment.train.optimizer import make_optimizer
    config = run.load_config()
    params = nnx.split(abstract_model(config, 320))[1]
    opt = jax.eval_shape(make_optimizer(config.train).init, params)
    _, opt_state, meta = checkpoints.restore(run, params, opt)
    assert meta == {"step": 0, "data_position": 0, "seed": 0}
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(opt_state[1][0].mu))  # fresh Adam moments


def test_pretrained_tokenizer_encodes_text_as_a_file_holds_it_and_round_trips(tmp_path):
    """A new import encodes lines as the text of a file (newlines, no special tokens): the ids the
    checkpoint's tokenizer gives for that text; a run imported before `line_end` existed (its
    tokenizer.json without it) keeps an end-of-sequence token after each line."""
    run = import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run")
    tokenizer = corpora.load_tokenizer(run.tokenizer_path)
    assert (tokenizer.kind, tokenizer.vocab_size, tokenizer.eos_id, tokenizer.line_end) == ("pretrained", 320, 2,
                                                                                            "newline")
    lines = ["the first line of text", "and a second one"]
    ids = tokenizer.encode_lines(lines)
    text = "the first line of text\nand a second one\n"
    assert ids.tolist() == tokenizer.hf_tokenizer().encode(text, add_special_tokens=False).ids
    assert 2 not in ids.tolist() and tokenizer.decode(ids) == text
    assert corpora.count_words_in_text(tokenizer.decode(ids)) == corpora.count_words(lines)
    saved = tmp_path / "again.json"
    corpora.save_tokenizer(tokenizer, saved)
    assert corpora.load_tokenizer(saved).encode_lines(lines).tolist() == ids.tolist()

    spec = json.loads(run.tokenizer_path.read_text())
    del spec["line_end"]  # as import_hf wrote it before
    (tmp_path / "old.json").write_text(json.dumps(spec))
    old = corpora.load_tokenizer(tmp_path / "old.json")
    ids = old.encode_lines(lines)
    assert old.line_end == "eos" and [int(i) for i in ids].count(2) == 2 and int(ids[-1]) == 2
    assert old.decode(ids).count("\n") == 2
    assert corpora.count_words_in_text(old.decode(ids)) == corpora.count_words(lines)
    with pytest.raises(ValueError, match="import_hf.py"):
        corpora.build_tokenizer("pretrained", ["x"])


def test_evaluate_an_imported_run_on_a_local_corpus(tmp_path):
    corpus = local_corpus(tmp_path)
    import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run", data={"source": "local", "path": str(corpus)})
    records = evaluate(tmp_path / "run", [64, 128], max_tokens=2048)
    assert [r["eval_length"] for r in records] == [64, 128]
    assert all(math.isfinite(r["ppl"]) and r["ppl"] > 1 and math.isfinite(r["word_ppl"]) for r in records)
    assert records[0]["tokenizer"] == "pretrained"
    yarn = evaluate(tmp_path / "run", [128], max_tokens=2048, overrides={"posenc.rope.yarn_scale": "4"})
    assert math.isfinite(yarn[0]["ppl"]) and yarn[0]["overrides"]
    self_extend = evaluate(tmp_path / "run", [128], max_tokens=2048,
                           overrides={"posenc.rope.self_extend_window": "16", "posenc.rope.self_extend_group": "4"})
    assert math.isfinite(self_extend[0]["ppl"])


def test_a_bad_data_path_is_refused_at_import_and_a_moved_one_names_a_fix_evaluation_has(tmp_path):
    """Issue 32: an import with a bad --data_path was accepted, and the evaluation then said "set
    --config.data.path", a flag eval_extrapolate.py does not have."""
    src = checkpoint(tmp_path, "llama")
    with pytest.raises(corpora.DataError, match=r"data folder .*absent.* does not exist; set --data_path to a folder"):
        import_hf(src, tmp_path / "run", data={"source": "local", "path": str(tmp_path / "absent")})
    assert not (tmp_path / "run").exists()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "valid.txt").write_text("a line of text\n" * 50)
    import_hf(src, tmp_path / "run", data={"source": "local", "path": str(corpus)})
    corpus.rename(tmp_path / "moved")
    with pytest.raises(corpora.DataError) as error:
        evaluate(tmp_path / "run", [64], max_tokens=256)
    message = str(error.value)
    assert "--config.data" not in message and "edit data.path (and data.source) there" in message
    assert f"data section of {tmp_path / 'run' / 'config.json'}" in message and "import_hf.py CHECKPOINT" in message


def test_a_tokenizer_kept_apart_is_given_with_tokenizer(tmp_path):
    """Issue 32: a checkpoint folder without tokenizer.json was refused with no way to give one."""
    src = _no_tokenizer(checkpoint(tmp_path, "llama"))
    with pytest.raises(HFError, match="no tokenizer.json; .*give it with --tokenizer PATH"):
        import_hf(src, tmp_path / "refused")
    run = import_hf(src, tmp_path / "run", tokenizer=FIXTURES / "llama" / "tokenizer.json")
    assert run.tokenizer(run.load_config().data, write=False).vocab_size == 320
    with pytest.raises(HFError, match=rf"--tokenizer {tmp_path}: no such file in it"):
        import_hf(src, tmp_path / "other", tokenizer=tmp_path)


def _tokenizer_file(tmp_path: Path, tokenizer, name: str) -> Path:
    path = tmp_path / name
    tokenizer.save(str(path))
    return path


def test_a_given_tokenizer_is_checked_against_the_checkpoint_and_announced(tmp_path, caplog):
    """Issue 67, case 2: a 320-token tokenizer for a 49,152-row embedding imported without a word."""
    from tokenizers import Tokenizer
    own = Tokenizer.from_file(str(FIXTURES / "llama" / "tokenizer.json"))
    byte_level = _tokenizer_file(tmp_path, corpora.tokenizers.ByteTokenizer().hf_tokenizer(), "bytes.json")
    src = checkpoint(tmp_path, "llama")
    with pytest.raises(HFError, match=r"--tokenizer .*bytes.json: 256 tokens, but .* carries a tokenizer of 320; "
                                      r"drop --tokenizer"):
        import_hf(src, tmp_path / "run", tokenizer=byte_level)
    with pytest.raises(HFError, match="256 tokens for a model of 320 embedding rows: every id would score the wrong"):
        import_hf(_no_tokenizer(checkpoint(tmp_path / "b", "llama")), tmp_path / "run", tokenizer=byte_level)
    spec = json.loads(own.to_str())  # the same size, another token at the end-of-sequence id
    vocab = spec["model"]["vocab"]
    eos, other = next(t for t, i in vocab.items() if i == 2), next(t for t, i in vocab.items() if i == 3)
    vocab[eos], vocab[other] = 3, 2
    swapped = _tokenizer_file(tmp_path, Tokenizer.from_str(json.dumps(spec)), "swapped.json")
    with pytest.raises(HFError, match=re.escape(f"id 2 (eos_token_id) is {other!r}, the checkpoint's own "
                                                  f"tokenizer has {eos!r} there")):
        import_hf(src, tmp_path / "run", tokenizer=swapped)
    assert not (tmp_path / "run").exists()
    caplog.set_level("WARNING")
    import_hf(src, tmp_path / "run", tokenizer=FIXTURES / "llama" / "tokenizer.json")
    assert "replaces the tokenizer" in caplog.text and "the same 320 tokens" in caplog.text


def test_a_missing_end_of_sequence_id_blames_the_config_that_lacks_it(tmp_path):
    """Issue 45, item 7: qwen2's config.json lacks eos_token_id, and the error blamed the llama folder
    given with --tokenizer."""
    src = tmp_path / "qwen2"
    shutil.copytree(FIXTURES / "qwen2", src)  # no eos_token_id, no tokenizer.json
    with pytest.raises(HFError) as error:
        import_hf(src, tmp_path / "run", tokenizer=FIXTURES / "llama")
    message = str(error.value)
    assert message.startswith(f"no end-of-sequence token: {src / 'config.json'} has no eos_token_id, and the "
                              f"tokenizer ({FIXTURES / 'llama'}) has no "), message
    assert message.endswith(f"; set eos_token_id in {src / 'config.json'}") and not (tmp_path / "run").exists()


def _drop(name):
    return lambda t: {k: v for k, v in t.items() if k != name}


def _truncate(folder: Path) -> Path:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    return folder


def _architecture(folder: Path) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    return folder


def _no_tokenizer(folder: Path) -> Path:
    (folder / "tokenizer.json").unlink()
    return folder


REFUSALS = {
    "architecture": (lambda tmp: _architecture(checkpoint(tmp, "qwen2")), "BertForMaskedLM"),
    "missing-tensor": (lambda tmp: checkpoint(tmp, "llama", _drop("model.layers.1.mlp.up_proj.weight")),
                       "model.layers.1.mlp.up_proj.weight is missing"),
    "shape": (lambda tmp: checkpoint(tmp, "llama", lambda t: {**t, "model.norm.weight": t["model.norm.weight"][:3]}),
              "model.norm.weight has shape"),
    "truncated": (lambda tmp: _truncate(checkpoint(tmp, "llama")), "truncated"),
    "no-tokenizer": (lambda tmp: _no_tokenizer(checkpoint(tmp, "llama")), "no tokenizer.json"),
    "hub-id": (lambda tmp: "no-such-owner-lx/no-such-model", "cannot be fetched from the Hugging Face hub"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_are_one_line_and_leave_no_workdir(tmp_path, case):
    make, match = REFUSALS[case]
    src = make(tmp_path)
    workdir = tmp_path / "out" / "run"
    result = run_entry("import_hf.py", str(src), "--workdir", str(workdir),
                       env={"HF_HUB_OFFLINE": "1"} if case == "hub-id" else None)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and match in errors[0] and "Traceback" not in result.stderr
    assert not workdir.exists()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []  # no staging folder


def test_a_workdir_holding_a_run_is_refused(tmp_path):
    import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run")
    before = sorted(p.name for p in (tmp_path / "run").rglob("*"))
    with pytest.raises(ValueError, match="already holds a run"):
        import_hf(checkpoint(tmp_path / "b", "llama"), tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == before


def test_import_into_an_empty_folder(tmp_path):
    (tmp_path / "run").mkdir()
    assert import_hf(checkpoint(tmp_path, "gpt_neox"), tmp_path / "run").exists()


@pytest.mark.parametrize("arch,case", [("llama", "default"), ("llama", "yarn"), ("gpt_neox", "default")])
def test_export_gives_the_stored_logits_and_tensors(tmp_path, arch, case):
    src = checkpoint(tmp_path, arch)
    rope = ROPE_PARAMETERS[case] if case != "default" else None
    import_hf(src, tmp_path / "run", rope_parameters=rope)
    out = export_hf(tmp_path / "run", tmp_path / "exported")
    model, tokenizer = hf.load(out)
    assert tokenizer is not None and json.loads((out / "config.json").read_text())["eos_token_id"] == 2
    ids, expected = stored(arch, case)
    got = np.asarray(model(jnp.asarray(ids)[None])[0])
    print(f"export {arch}/{case}: largest absolute logit difference {np.abs(got - expected).max():.3g}")
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    original, exported = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(original) == set(exported)
    for name in original:
        np.testing.assert_array_equal(original[name], exported[name], err_msg=name)


def test_export_writes_only_into_a_folder_it_owns(tmp_path):
    """Issue 32: --out set to the run itself, to another run or to a folder of the user's files had
    its config.json and tokenizer.json replaced (the run was then refused as damaged)."""
    run = import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run").path
    other = fake_run(tmp_path, "rope", 64, "/data/corpus", {64: 5.0}, name="other")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "own"}')
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for out, what in ((run, "is a run folder"), (other, "is a run folder"),
                      (mine, r"holds files that export_hf.py did not write \(config.json\)")):
        with pytest.raises(RunError, match=rf"^--out {out} {what}.*give a new or empty folder, e.g. --out {out}_hf"):
            export_hf(run, out)
    with pytest.raises(HFError, match=r"^--set model.attention=blockwise: a Hugging Face checkpoint holds no "
                                      r"model.attention, so the export would ignore it; drop it"):
        export_hf(run, tmp_path / "ignored", {"model.attention": "blockwise"})  # was accepted and dropped
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_full_device_during_an_export_names_the_file_and_the_size_and_keeps_the_folder(tmp_path, monkeypatch):
    """Issue 45, items 9 and 1: `no space left on device: a file`; a NOTES.md beside an earlier export."""
    import shutil as shell
    from experiment.store import files
    run = import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run").path
    exported = export_hf(run, tmp_path / "exported")
    (exported / "NOTES.md").write_text("mine")
    before = {p: p.read_bytes() for p in exported.iterdir()}
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: shell._ntuple_diskusage(10**9, 10**9 - 100, 100))
    with pytest.raises(files.NoSpace, match=rf"^no space left on device: {exported / 'model.safetensors'} "
                                            r"\(\d+ MB needed\)$"):
        export_hf(run, exported)
    assert {p: p.read_bytes() for p in exported.iterdir()} == before


def test_export_entry_point_and_rope_without_hf_form(tmp_path):
    import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run", rope_parameters=ROPE_PARAMETERS["llama3"])
    result = run_entry("export_hf.py", str(tmp_path / "run"), "--out", str(tmp_path / "exported"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["rope_parameters"]["rope_type"] == "llama3"
    config = RunDir(tmp_path / "run").load_config()
    block = config.posenc
    block.rope.self_extend_window = 16
    with pytest.raises(HFError, match="self_extend_window"):
        hf_rope_parameters(block, 64)
    block.rope.self_extend_window = 0
    block.rope.p_rope = 0.5
    with pytest.raises(HFError, match="p_rope"):
        hf_rope_parameters(block, 64)


@pytest.mark.parametrize("rope, says", [
    ({"factor": 4}, r'no rope_type in {"factor": 4}: name the scaling'),
    ({"rope_type": "yarn", "factor": 4, "bogus_key": 1}, "'bogus_key' is not a key of rope_type 'yarn'"),
    ({"rope_type": "linear", "factor": 2, "beta_fast": 8}, "'beta_fast' is not a key of rope_type 'linear'"),
    ({"rope_type": "ntk", "factor": 2}, "rope_type 'ntk' is not supported"),
])
def test_a_written_rope_dict_names_its_type_and_holds_only_its_keys(tmp_path, rope, says):
    """Issue 67, case 4: {"factor": 4} imported as plain RoPE, unknown keys taken without a word."""
    with pytest.raises(HFError, match=re.escape("(import_hf.py --rope_parameters)") + ".*" + says):
        import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run", rope_parameters=rope)
    assert not (tmp_path / "run").exists()
