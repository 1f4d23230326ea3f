"""The table of attention paths (models/attention/paths.py): every refusal is one line that names
what to change, an explicit path raises its row's refusal, and a new path is one function and one
row: the decoder runs it, the device check (verify.py) checks it where its row says so, and the
self-check measures it, with no other change."""
import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.attention import choice, paths, verdicts
from models.attention.tiles import NEG_INF, tile_logits
from models.config import ModelConfig

CFG = ModelConfig(vocab_size=37, num_layers=1, d_model=32, num_heads=4, mlp_dim=64)
SPECS = [paths.CallSpec("x", 24, 16, "float32", dropping, masked, training)
         for dropping, masked, training in itertools.product((False, True), repeat=3)]


def _scheme(name: str):
    dims = posenc.ModelDims(d_model=32, num_heads=2, head_dim=16, num_layers=1, train_length=16)
    return posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", posenc.names())
def test_every_refusal_is_one_line_naming_the_option_and_the_way_out(name):
    traits, refused = posenc.get(name).traits, 0
    for (path, row), spec in itertools.product(paths.PATHS.items(), SPECS):
        spec = dataclasses.replace(spec, scheme=name)
        refusal = row.accepts(traits, spec)
        if refusal is None:
            continue
        refused += 1
        assert "\n" not in refusal and "model." in refusal, (path, spec, refusal)
        assert any(fix in refusal for fix in ("set ", "use ", "leave both at 0")), (path, spec, refusal)
        assert name in refusal or f"model.attention={path}" in refusal or "Lambda mask" in refusal
    assert refused  # dropout or the Lambda mask is refused somewhere for every scheme
    plain = paths.CallSpec(name, 24, 16, "float32")
    assert paths.PATHS["dense"].accepts(traits, plain) is None  # dense takes every scheme


@pytest.mark.parametrize("name,path,dropping,masked", [
    ("shaw", "triangular", False, False), ("cope", "fused", False, False), ("fox", "pallas", False, False),
    ("alibi", "blockwise", True, False), ("alibi", "fused", True, False), ("alibi", "triangular", False, True),
    ("cope", "dense", False, True), ("alibi", "dense", True, True), ("stickbreaking", "dense", True, False)])
def test_an_explicit_path_raises_its_rows_refusal(name, path, dropping, masked):
    cfg = dataclasses.replace(CFG, attention=path, attention_sinks=2 if masked else 0)
    pos = jnp.arange(12, dtype=jnp.int32)[None]
    want = paths.PATHS[path].accepts(posenc.get(name).traits, paths.CallSpec(name, 12, 16, "float32", dropping, masked))
    assert want
    with pytest.raises(ValueError) as refused:
        choice.choose(cfg, _scheme(name), pos, jnp.float32, dropping=dropping)
    assert str(refused.value) == want


# ---- a new path: one function and one row ---------------------------------------------------------

def toy_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, call: paths.Call) -> jax.Array:
    """Causal softmax attention written out: the scheme's rotation and tile logits, one softmax."""
    q, k = call.scheme.rotate(q_BxTxHxK, k_BxTxHxK, call.q_pos, call.k_pos)
    logits_BxHxTxS = tile_logits(q, k, call.q_pos, call.k_pos, call.scheme)
    causal_TxS = jnp.tril(jnp.ones(logits_BxHxTxS.shape[-2:], bool))
    probs = jax.nn.softmax(jnp.where(causal_TxS, logits_BxHxTxS, NEG_INF), axis=-1)
    return jnp.einsum("bhts,bshk->bthk", probs.astype(v_BxTxHxK.dtype), v_BxTxHxK)


def toy_accepts(traits: posenc.Traits, spec: paths.CallSpec) -> str | None:
    if spec.dropping or spec.masked:
        return "model.attention=toy has no attention dropout and no Lambda mask; use dense"
    if traits.value_term or traits.needs_full_rows or traits.normalization != "softmax":
        return f"positional scheme {spec.scheme!r} is more than logits and a softmax; model.attention=toy: use dense"
    return None


TOY = paths.AttentionPath(toy_attention, toy_accepts, "toy attention (model.attention=toy)", checked=lambda: True)


@pytest.fixture
def checks(monkeypatch, tmp_path):
    """The device check's caches empty, its disk cache in tmp_path."""
    monkeypatch.setattr(verdicts, "cache_folder", lambda: tmp_path / "kernel_checks")
    monkeypatch.setattr(verdicts, "_VERDICTS", {})
    return tmp_path / "kernel_checks"


def test_a_new_path_runs_in_the_decoder_after_its_device_check(monkeypatch, checks):
    monkeypatch.setitem(paths.PATHS, "toy", TOY)
    x = jax.random.randint(jax.random.key(1), (2, 20), 0, CFG.vocab_size)
    dense, toy = (DecoderLM(dataclasses.replace(CFG, attention=path), posenc.default_config("alibi"), 16,
                            rngs=nnx.Rngs(0)) for path in ("dense", "toy"))
    np.testing.assert_allclose(toy(x), dense(x), atol=1e-5)
    saved = [p.name for p in checks.iterdir()]  # its row says `checked`: the device check ran it first
    assert len(saved) == 1 and saved[0].startswith("check-toy-") and "-alibi-" in saved[0]
    with pytest.raises(ValueError, match="positional scheme 'shaw' is more than logits"):
        DecoderLM(dataclasses.replace(CFG, attention="toy"), posenc.default_config("shaw"), 16, rngs=nnx.Rngs(0))(x)


def test_the_device_check_refuses_a_wrong_new_path(monkeypatch, checks):
    wrong = dataclasses.replace(TOY, run=lambda q, k, v, call: toy_attention(
        q, k, v, dataclasses.replace(call, k_pos=call.k_pos // 2)))  # the bias read at other key positions
    monkeypatch.setitem(paths.PATHS, "toy", wrong)
    pos = jnp.arange(16, dtype=jnp.int32)[None]
    with pytest.raises(ValueError, match="model.attention=toy: toy attention .* failed its numerical check"):
        choice.choose(dataclasses.replace(CFG, attention="toy"), _scheme("alibi"), pos, jnp.float32, dropping=False)
    unchecked = dataclasses.replace(CFG, attention="toy", attention_check=False)
    assert choice.choose(unchecked, _scheme("alibi"), pos, jnp.float32, dropping=False) == "toy"


def test_the_self_check_measures_a_new_path(monkeypatch, checks, tmp_path):
    from experiment.selfcheck import check as selfcheck, measure
    monkeypatch.setitem(paths.PATHS, "toy", TOY)
    monkeypatch.setattr(measure, "timed", lambda *args: {})  # errors only: throughput is the short table's test
    plan = dataclasses.replace(selfcheck.make_plan(short=True, schemes="alibi,shaw", lengths="24"),
                               interpreter_max_length=0)  # Pallas' interpreter: the short table's test
    result, status = selfcheck.run(plan, tmp_path / "out", say=lambda line: None)
    rows = {(r["scheme"], r["path"]): r for r in result["rows"]}
    assert status == 0 and {p for _, p in rows} == set(paths.PATHS)
    toy = rows["alibi", "toy"]
    assert toy["status"] == "ok" and toy["forward_error"] < 1e-5 and toy["gradient_error"] < 1e-5
    assert toy["note"] == "device check passed"  # its row says `checked`
    assert rows["shaw", "toy"]["status"] == "n/a" and "model.attention=toy" in rows["shaw", "toy"]["note"]
