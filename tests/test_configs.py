"""Every shipped config loads, resolves and builds its model (abstractly, nothing allocated)."""
import importlib.util
import pathlib

import jax
import pytest
from flax import nnx

from experiment import config_util
from models import DecoderLM, ModelConfig
from tests.conftest import REPO

CONFIGS = sorted(p for p in (REPO / "configs").glob("*.py") if p.name != "__init__.py")


def load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_builds_a_model(path):
    config = config_util.resolve(load(path).get_config())
    assert config.eval.lengths and config.train.steps > 0
    vocab = 256 if config.data.tokenizer == "byte" else config.data.get("max_vocab") or 1000
    model_cfg = ModelConfig.from_config(config.model, vocab)
    abstract = nnx.eval_shape(lambda: DecoderLM(model_cfg, config.posenc, config.train.seq_len, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    assert sum(x.size for x in jax.tree.leaves(params)) > 0
    assert "python" in (load(path).__doc__ or "")  # the docstring gives the command
