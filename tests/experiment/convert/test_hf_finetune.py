"""Runs that leave the Hugging Face round trip of test_hf.py: an imported checkpoint fine-tuned at
4x its window through configs/extend.py, then exported; a Llama-block model trained here, exported
with every rope option that has an HF form and re-imported; eval-time options on an imported run
(log-n around its RoPE, LongRoPE's factor lists by --set)."""
from __future__ import annotations

import importlib.util
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import nnx

from experiment import config as config_lib
from experiment.convert.hf import export_hf, import_hf
from experiment.evals import evaluate
from experiment.train import train
from experiment.evals.common import apply_overrides, load_checkpoint, parse_overrides
from experiment.model import abstract_model
from experiment.store.run import RunDir
from experiment.train import init_from, train
from models.formats import hf
from models.formats.hf_mapping import HFError
from tests.conftest import REPO, tiny_config
from tests.experiment.convert.test_hf import local_corpus
from tests.experiment.convert.test_hf import FIXTURES, ROPE_PARAMETERS, stored


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The tiny llama checkpoint (window 64) as a run, evaluating a small local corpus."""
    root = tmp_path_factory.mktemp("imported")
    corpus = local_corpus(root, lines=200)
    import_hf(FIXTURES / "llama", root / "run", data={"source": "local", "path": str(corpus)})
    return root / "run"


def model_logits(workdir, ids, overrides=None) -> np.ndarray:
    """Logits of the model evaluation builds from the run (with eval-time `overrides`)."""
    run = RunDir(workdir)
    scoring = load_checkpoint(run, run.load_config(), [], dict(overrides or {}))
    return np.asarray(scoring.model()(jnp.asarray(ids)[None])[0])


def exported_logits(folder, ids) -> np.ndarray:
    model, _ = hf.load(folder)
    return np.asarray(model(jnp.asarray(ids)[None])[0])


def extend_config(method: str, base):
    spec = importlib.util.spec_from_file_location("extend", REPO / "configs" / "extend.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(f"{method},{base}")
    config.train.update(dict(steps=2, batch_size=2, log_every=1, checkpoint_every=2, warmup_steps=1))
    return config


def test_extend_takes_the_model_tokenizer_and_window_of_an_imported_base(imported, tmp_path):
    """configs/extend.py:METHOD,IMPORTED needs no hand-editing: the checkpoint's parameters fit."""
    config = config_lib.resolve(extend_config("yarn", imported))
    assert config.train.seq_len == 256 and config.data.tokenizer == "pretrained"
    assert config.model.norm == "rmsnorm" and config.model.num_kv_heads == 2 and not config.model.tie_embeddings
    assert (config.posenc.rope.yarn_scale, config.posenc.rope.original_length) == (4.0, 64)
    assert config.data.source == "local"  # the base's evaluation data
    base = init_from.base_of(config)
    target = nnx.split(abstract_model(config, 320))[1]
    _, origin = init_from.load_base_params(config, base, target, 320)  # refuses parameters that do not fit
    assert origin["step"] == 0 and origin["train_length"] == 64


@pytest.mark.slow  # two compiled training steps at 256 tokens and the exports: ~30 s each on 2 loaded cores
@pytest.mark.parametrize("method,rope_type", [("yarn", "yarn"), ("pi", "linear")])
def test_fine_tune_an_imported_run_at_4x_then_export(imported, tmp_path, method, rope_type):
    """import -> a few fine-tune steps at 4x the window -> evaluate -> export -> reload: the
    exported checkpoint gives the fine-tuned run's evaluation logits."""
    config = extend_config(method, imported)
    assert train(config, tmp_path / "tuned")["done"]
    record = evaluate(tmp_path / "tuned", [256], max_tokens=512)[0]
    assert math.isfinite(record["ppl"]) and record["tokenizer"] == "pretrained" and record["step"] == 2
    ids, _ = stored("llama", "default")
    tuned = model_logits(tmp_path / "tuned", ids)
    same_options = {f"posenc.rope.{k}": str(config.posenc.rope[k]) for k in ("pi_factor", "yarn_scale")}
    assert not np.allclose(tuned, model_logits(imported, ids, same_options), atol=1e-4)  # the fine-tune trained

    out = export_hf(tmp_path / "tuned", tmp_path / "exported")
    exported = json.loads((out / "config.json").read_text())
    assert exported["max_position_embeddings"] == 256 and exported["rope_parameters"]["rope_type"] == rope_type
    assert exported["rope_parameters"]["factor"] == 4.0
    got = exported_logits(out, ids)
    print(f"fine-tuned {method}, exported: largest absolute logit difference {np.abs(got - tuned).max():.3g}")
    np.testing.assert_allclose(got, tuned, atol=1e-4, rtol=0)


LLAMA_BLOCK = dict(norm="rmsnorm", mlp="gated", activation="silu", num_kv_heads=2, qkv_bias=False, out_bias=False,
                   mlp_bias=False, scale_embeddings=False, tie_embeddings=False)
HF_FORMS = {  # rope options (as --set takes them) -> the rope_type they export as
    "default": ({}, "default"),
    "pi": ({"posenc.rope.pi_factor": "0.25"}, "linear"),
    "dynamic": ({"posenc.rope.dynamic_ntk": "true", "posenc.rope.dynamic_ntk_factor": "2"}, "dynamic"),
    "yarn": ({"posenc.rope.yarn_scale": "4"}, "yarn"),
    "llama3": ({"posenc.rope.llama3_factor": "4"}, "llama3"),
    "longrope": ({"posenc.rope.longrope_short_factor": "1,1.5,2,3", "posenc.rope.longrope_long_factor": "2,3,4,6",
                  "posenc.rope.longrope_factor": "4"}, "longrope"),
}


def test_a_llama_block_trained_here_exports_with_every_hf_rope_form_and_round_trips(tmp_path):
    config = tiny_config("rope")
    config.model.update(LLAMA_BLOCK)
    config.train.update(dict(steps=1, batch_size=2))
    train(config, tmp_path / "run")
    ids = np.asarray(jax.random.randint(jax.random.key(1), (64,), 0, 256))  # 4x the training length
    for name, (overrides, rope_type) in HF_FORMS.items():
        out = export_hf(tmp_path / "run", tmp_path / name, overrides)
        saved = json.loads((out / "config.json").read_text())
        assert saved["architectures"] == ["LlamaForCausalLM"] and saved["rope_parameters"]["rope_type"] == rope_type
        expected, got = model_logits(tmp_path / "run", ids, overrides), exported_logits(out, ids)
        print(f"trained here, {name}: largest absolute logit difference {np.abs(got - expected).max():.3g}")
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    for no_form, match in (({"posenc.rope.ntk_alpha": "2"}, "ntk_alpha=2"), ({"posenc.name": "logn"}, "'logn'"),
                           ({"posenc.rope.dca_chunk_size": "12"}, "dca_chunk_size=12")):
        with pytest.raises(HFError, match=match):
            export_hf(tmp_path / "run", tmp_path / "refused", no_form)

    import_hf(tmp_path / "default", tmp_path / "back")  # byte tokenizer exported as tokenizer.json, eos 10
    back = RunDir(tmp_path / "back")
    assert back.load_config().data.tokenizer == "pretrained"
    config = RunDir(tmp_path / "run").load_config()
    lines = ["a line of text,", "and one with bytes beyond ASCII: \u00e9\u00e8 \u2192 \U0001f642"]
    assert back.tokenizer(config.data, write=False).encode_lines(lines).tolist() == \
        RunDir(tmp_path / "run").tokenizer(config.data, write=False).encode_lines(lines).tolist()
    np.testing.assert_array_equal(model_logits(tmp_path / "back", ids), model_logits(tmp_path / "run", ids))


def test_log_n_switches_on_at_evaluation_around_the_runs_rope(imported):
    plain = evaluate(imported, [64, 128], max_tokens=512)
    logn = evaluate(imported, [64, 128], max_tokens=512, overrides={"posenc.name": "logn"})
    assert logn[0]["scheme"] == "logn" and logn[0]["overrides"] == {"posenc.name": "logn"}
    assert logn[0]["nll"] == pytest.approx(plain[0]["nll"], rel=1e-6)  # log n / log L <= 1 within L
    assert logn[1]["nll"] != pytest.approx(plain[1]["nll"], rel=1e-4)
    both = apply_overrides(RunDir(imported).load_config(), {"posenc.name": "logn", "posenc.rope.yarn_scale": "2"})
    assert (both.posenc.name, both.posenc.logn.base, both.posenc.rope.yarn_scale) == ("logn", "rope", 2.0)
    for bad, match in (({"posenc.name": "alibi"}, "wrapper of it"),
                       ({"posenc.name": "logn", "posenc.logn.base": "alibi"}, "not change it")):
        with pytest.raises(ValueError, match=match):
            evaluate(imported, [64], max_tokens=512, overrides=bad)


def test_longrope_factor_lists_set_at_evaluation_give_the_checkpoints_longrope_logits(imported):
    params = ROPE_PARAMETERS["longrope"]
    text = parse_overrides(f"posenc.rope.longrope_short_factor={','.join(map(str, params['short_factor']))},"
                           f"posenc.rope.longrope_long_factor={','.join(map(str, params['long_factor']))},"
                           f"posenc.rope.longrope_factor={params['factor']},posenc.rope.original_length=64")
    assert len(text) == 4
    ids, expected = stored("llama", "longrope")
    np.testing.assert_allclose(model_logits(imported, ids, text), expected, atol=1e-4, rtol=0)
