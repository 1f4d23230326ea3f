"""Which attention path runs (models/attention/choice.py): `auto`'s choices through the decoder,
the explicit paths that refuse attention dropout, the tile width evaluation plans with, and when
training on several devices runs per device."""
import dataclasses

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.attention import choice, pallas, paths, tuning, verify
from models.config import ModelConfig

CFG = dict(vocab_size=37, num_layers=1, d_model=32, num_heads=4, mlp_dim=64)
T = 70


def tokens(seed=1, t=T, b=3):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, CFG["vocab_size"])


def model(name, train_length=80, **options):
    return DecoderLM(ModelConfig(**{**CFG, **options}), posenc.default_config(name),
                     train_length=train_length, rngs=nnx.Rngs(0))


def _scheme(name: str):
    dims = posenc.ModelDims(d_model=32, num_heads=2, head_dim=16, num_layers=1, train_length=16)
    return posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))


def _spec(scheme, length, dropping=False, masked=False):
    return paths.CallSpec(scheme.name, length, 16, "float32", dropping, masked)


def test_attention_path_order():
    alibi, deberta, shaw = posenc.get("alibi"), posenc.get("deberta"), posenc.get("shaw")
    usable = lambda: True  # the Pallas kernel compiled and checked here
    path = lambda scheme, length, **kw: choice.attention_path("auto", 8, scheme, _spec(scheme, length, **kw))
    assert choice.attention_path("dense", 8, alibi, _spec(alibi, 100), kernel=usable) == "dense"  # explicit wins
    assert choice.attention_path("auto", 8, alibi, _spec(alibi, 100), kernel=usable) == "pallas"
    assert choice.attention_path("auto", 8, shaw, _spec(shaw, 100), kernel=usable) == "blockwise"  # refuses shaw
    assert path(alibi, 17) == "blockwise"  # beyond 2 blocks
    assert path(alibi, 16) == "triangular"
    assert path(alibi, 17, dropping=True) == "triangular"
    assert path(shaw, 17, dropping=True) == "dense"  # a value term: not triangular
    per_key = type("PerKey", (deberta,), {"traits": deberta.traits.replace(bias_work_per_key=True)})
    assert path(per_key, 16) == "dense"  # per-key bias work
    assert path(deberta, 16) == "triangular"
    assert path(alibi, 17, masked=True) == "blockwise"  # the Lambda mask: blockwise
    assert path(alibi, 16, masked=True) == "dense"  # or dense
    stickbreaking = posenc.get("stickbreaking")
    with pytest.raises(ValueError, match="stick-breaking attention.*attention_dropout=0"):  # no path: dense's refusal
        path(stickbreaking, 16, dropping=True)


def test_auto_picks_triangular_where_possible_and_dense_elsewhere():
    x = tokens()
    for name in ("alibi", "shaw"):
        dense = model(name, attention="dense")
        auto = model(name, attention="auto")
        np.testing.assert_allclose(auto(x), dense(x), atol=1e-5, rtol=1e-5)


def test_auto_trains_schemes_whose_bias_works_per_key_with_dense(monkeypatch):
    """A scheme whose bias does work per key, which row tiles would repeat for each key prefix
    (`bias_work_per_key`; here DeBERTa made so), trains on dense under `auto` (and so does a wrapper
    around it); DeBERTa itself, since its bias multiplies only each tile's distances, on triangular."""
    deberta = posenc.get("deberta")
    own = deberta.traits
    monkeypatch.setattr(deberta, "traits", own.replace(bias_work_per_key=True))
    calls = []
    row = paths.PATHS["triangular"]
    monkeypatch.setitem(paths.PATHS, "triangular",
                        dataclasses.replace(row, run=lambda *a: calls.append(1) or row.run(*a)))
    x = tokens()
    logn_deberta = posenc.default_config("logn")
    logn_deberta.logn.base = "deberta"
    for label, cfg, expected in (("alibi", posenc.default_config("alibi"), True),
                                 ("deberta", posenc.default_config("deberta"), False),
                                 ("logn(deberta)", logn_deberta, False)):
        calls.clear()
        DecoderLM(ModelConfig(**CFG, attention="auto"), cfg, train_length=80, rngs=nnx.Rngs(0))(x)
        assert bool(calls) is expected, label
    monkeypatch.setattr(deberta, "traits", own)
    calls.clear()
    DecoderLM(ModelConfig(**CFG, attention="auto"), posenc.default_config("deberta"), train_length=80,
              rngs=nnx.Rngs(0))(x)
    assert calls, "deberta trains on triangular"


@pytest.mark.parametrize("path", ["blockwise", "fused"])
def test_paths_without_attention_dropout_refuse_it_in_training(path):
    m = model("alibi", train_length=16, attention=path, attention_dropout=0.1)
    x = tokens(0, t=12, b=2)
    m(x)  # evaluation: fine
    with pytest.raises(ValueError, match="attention=dense"):
        m(x, dropout_key=jax.random.key(0))


def test_tile_width_for_evaluation():
    alibi = posenc.get("alibi")
    section = ml_collections.ConfigDict({"attention": "auto", "attention_block": 8})
    assert choice.tile_width(section, alibi, 100) == 8  # long: blockwise tiles
    assert choice.tile_width(section, alibi, 16) is None  # short: full rows
    assert choice.tile_width(ModelConfig(attention_block=8), alibi, 100) == 8
    assert choice.tile_width({"attention": "pallas"}, alibi, 16) == pallas.BLOCK
    assert choice.tile_width({"attention": "dense"}, alibi, 10_000) is None
    assert choice.tile_width({}, alibi, 1025) == 512 and choice.tile_width({}, alibi, 1024) is None  # defaults


def test_training_runs_per_device_where_the_compiled_kernel_would_be_used(monkeypatch):
    auto, explicit, xla = {"attention": "auto"}, {"attention": "pallas"}, {"attention": "dense"}
    assert not choice.runs_per_device(auto, _scheme("alibi"), 8)  # interpreted here: never
    monkeypatch.setattr(pallas, "interpreted", lambda: False)  # as on a GPU, where the kernel passes its check
    monkeypatch.setattr(tuning, "kernel_verdict", lambda *args: verify.Verdict(True, "passed"))
    assert choice.runs_per_device(auto, _scheme("alibi"), 8)
    assert choice.runs_per_device(auto, _scheme("rope"), 8)
    assert choice.runs_per_device(explicit, _scheme("alibi"), 8)
    assert choice.runs_per_device(ModelConfig(), _scheme("alibi"), 8)  # a ModelConfig too
    assert not choice.runs_per_device(auto, _scheme("alibi"), 1)
    assert not choice.runs_per_device(auto, _scheme("shaw"), 8)  # auto keeps XLA's paths for it
    assert not choice.runs_per_device(xla, _scheme("alibi"), 8)
    monkeypatch.setattr(tuning, "kernel_verdict", lambda *args: verify.Verdict(False, "mismatch", "wrong"))
    assert not choice.runs_per_device(auto, _scheme("alibi"), 8)  # auto keeps XLA's paths: no need
    assert choice.runs_per_device(explicit, _scheme("alibi"), 8)  # (choose refuses the kernel there)
