"""Context extension: a run that starts from another run's parameters (train.init_from)."""
import json

import jax
import numpy as np
import pytest
from flax import nnx

import posenc
from experiment import config as config_lib
from experiment.pipeline.run import grid_points, run_config, run_name
from experiment.runtime import sharding
from experiment.store import checkpoints
from experiment.store.run import RunDir
from experiment.train import init_from, init_state, train
from experiment.train.optimizer import make_optimizer
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    config = tiny_config("rope")
    config.train.steps = 2
    train(config, path)
    return path


def extension(base, **train_options):
    config = tiny_config("rope")
    config.train.update(dict(seq_len=32, steps=2, init_from=str(base), **train_options))
    config.posenc.rope.update(dict(pi_factor=0.5, original_length=16))
    return config


def test_the_extended_run_starts_with_the_bases_parameters_and_trains_at_its_own_length(base_run, tmp_path):
    config = extension(base_run)
    base = init_from.base_of(config)
    tokenizer = RunDir(base_run).tokenizer(config.data, write=False)
    mesh = sharding.mesh_from_config(config)
    _, fresh, _, _, _ = init_state(config, tokenizer.vocab_size, make_optimizer(config.train), mesh)
    params, origin = init_from.load_base_params(config_lib.resolve(config), base, fresh, tokenizer.vocab_size)
    saved, _, _ = checkpoints.restore(RunDir(base_run), fresh)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(saved)):
        np.testing.assert_array_equal(a, b)
    assert origin["step"] == 2 and origin["train_length"] == 16 and origin["scheme"] == "rope"

    summary = train(config, tmp_path)
    assert summary["done"] and json.loads((tmp_path / "config.json").read_text())["train"]["seq_len"] == 32
    assert RunDir(tmp_path).origin()["workdir"] == str(base_run.absolute())
    assert (tmp_path / "tokenizer.json").read_text() == (base_run / "tokenizer.json").read_text()


def test_a_fine_tune_takes_its_bases_chat_template_and_special_tokens(tmp_path):
    """An imported base (import_hf.py) keeps them beside its tokenizer; RULER's chat prompts and generate.py
    --chat read them from the fine-tuned run."""
    base, run = tmp_path / "base", tmp_path / "run"
    for folder in (base, run):
        folder.mkdir()
    (base / "tokenizer.json").write_text("{}")
    (base / "chat_template.jinja").write_text("{{ messages }}")
    (base / "special_tokens_map.json").write_text('{"bos_token": "<s>"}')
    init_from.take_tokenizer(RunDir(base), RunDir(run))
    assert sorted(p.name for p in run.iterdir()) == ["chat_template.jinja", "special_tokens_map.json", "tokenizer.json"]
    assert (run / "chat_template.jinja").read_text() == "{{ messages }}"


def test_a_model_that_does_not_fit_the_base_is_refused_before_anything_is_written(base_run, tmp_path):
    wider = extension(base_run)
    wider.model.d_model = 64
    with pytest.raises(ValueError, match=r"do not fit this model \(.*\(32,.*in the base, \(64,"):
        train(wider, tmp_path)
    other_scheme = extension(base_run)
    other_scheme.posenc.name = "t5"  # t5 has a bias table the base does not
    with pytest.raises(ValueError, match="only in this run"):
        train(other_scheme, tmp_path)
    other_tokens = extension(base_run)
    other_tokens.data.tokenizer = "word"
    with pytest.raises(ValueError, match="data.tokenizer=byte"):
        train(other_tokens, tmp_path)
    missing = extension(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="train.init_from=.*nowhere"):
        train(missing, tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_yarn_and_dynamic_ntk_scale_from_original_length():
    """A model trained at 64 with original_length=16 rotates exactly as one trained at 16."""
    def rope(train_length, **options):
        cfg = posenc.default_config("rope")
        cfg.rope.update(dict(yarn_scale=4.0, **options))
        dims = posenc.ModelDims(d_model=32, num_heads=2, head_dim=16, num_layers=1, train_length=train_length)
        return posenc.build(cfg, dims, rngs=nnx.Rngs(0))
    pos = jax.numpy.arange(40)[None]
    np.testing.assert_array_equal(rope(64, original_length=16)._inv_freq(pos), rope(16)._inv_freq(pos))
    assert not np.allclose(rope(64)._inv_freq(pos), rope(16)._inv_freq(pos))


def test_sweep_grid_names_each_point():
    points = grid_points({"train.steps": ["25", "100"], "train.lr": ["0.001"]})
    assert points == [{"train.steps": "25", "train.lr": "0.001"}, {"train.steps": "100", "train.lr": "0.001"}]
    config = run_config(tiny_config("rope"), "rope", 32, points[1])
    assert config.train.steps == 100 and isinstance(config.train.steps, int) and config.train.lr == 0.001
    assert run_name("rope", config, points[1]) == "rope_L32_steps100_lr0.001"
    with pytest.raises(ValueError, match="--grid train.nosuch"):
        run_config(tiny_config("rope"), "rope", 32, {"train.nosuch": "1"})
