"""Every shipped config loads, resolves and builds its model (abstractly, nothing allocated)."""
import importlib.util
import pathlib

import jax
import pytest
from flax import nnx

from experiment import config as config_lib
from models import DecoderLM
from tests.conftest import REPO

CONFIGS = sorted(p for p in (REPO / "configs").glob("*.py") if p.name != "__init__.py")


def load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_builds_a_model(path):
    config = config_lib.resolve(load(path).get_config())
    assert config.eval.lengths and config.train.steps > 0
    vocab = 256 if config.data.tokenizer == "byte" else config.data.vocab_size or 1000
    vocab = max([vocab, *[c + 1000 for c in config.model.adaptive_cutoffs]])
    model_cfg = config.model_for(vocab)
    abstract = nnx.eval_shape(lambda: DecoderLM(model_cfg, config.posenc, config.train.seq_len, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    assert sum(x.size for x in jax.tree.leaves(params)) > 0
    assert "python" in (load(path).__doc__ or "")  # the docstring gives the command


WIKITEXT103_VOCAB = 267_735  # Merity et al. 2016: the WikiText-103 training vocabulary


@pytest.mark.parametrize("arg", ["alibi,512", "sinusoidal,512", "rope,1024", "t5,3072"])
def test_paper_config_has_247m_parameters(arg):
    config = config_lib.resolve(load(REPO / "configs" / "wikitext103.py").get_config(arg))
    scheme, length = arg.split(",")
    assert config.posenc.name == scheme and config.train.seq_len == int(length)
    assert config.train.batch_size * config.train.seq_len == 8 * 9216
    model_cfg = config.model_for(WIKITEXT103_VOCAB)
    abstract = nnx.eval_shape(lambda: DecoderLM(model_cfg, config.posenc, config.train.seq_len, rngs=nnx.Rngs(0)))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    extra = {"t5": 32 * 8}.get(scheme, 0)  # T5's bucket table
    assert abs(count - extra - 247e6) / 247e6 < 0.01, count
    assert config.eval.lengths[0] == config.train.seq_len and 15_000 < max(config.eval.lengths) < 17_000


def test_paper_larger_model_variant_has_1_3b_parameters():
    config = config_lib.resolve(load(REPO / "configs" / "wikitext103.py").get_config("alibi,1024,1.3b"))
    assert (config.model.num_layers, config.model.d_model, config.model.num_heads, config.model.mlp_dim) == (
        25, 2048, 16, 8192)
    assert config.train.seq_len == 1024 and config.train.batch_size * 1024 == 8 * 9216
    model_cfg = config.model_for(WIKITEXT103_VOCAB)
    abstract = nnx.eval_shape(lambda: DecoderLM(model_cfg, config.posenc, config.train.seq_len, rngs=nnx.Rngs(0)))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert abs(count - 1.3e9) / 1.3e9 < 0.05, count
    with pytest.raises(ValueError, match="1.3b"):
        load(REPO / "configs" / "wikitext103.py").get_config("alibi,512,13b")
