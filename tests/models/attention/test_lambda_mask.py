"""LM-Infinite's Lambda mask (models/attention/lambda_mask.py) against a transcription of the authors'
Llama attention, blockwise equal to dense while visiting only the window's tiles, the paths that
refuse it, and `--set` at evaluation."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from experiment import config as config_lib
from experiment.evals import evaluate
from experiment.evals.common import apply_overrides
from experiment.train import train
from models import DecoderLM
from models.config import ModelConfig
from models.attention import Call, blockwise_call, choice
from models.attention.lambda_mask import LambdaMask, lambda_dense_attention, lambda_mask
from models.config import ModelConfig
from tests.conftest import tiny_config

L, T, D = 8, 21, 8
DIMS = posenc.ModelDims(d_model=2 * D, num_heads=2, head_dim=D, num_layers=1, train_length=L)


def _rotated(x, position):
    """HF Llama's apply_rotary_pos_emb (as LM-Infinite's models/llama.py calls it) at one position."""
    inv_freq = 10000.0 ** (-np.arange(0, D, 2) / D)
    angle = np.concatenate([position * inv_freq, position * inv_freq])
    half = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)
    return x * np.cos(angle) + half * np.sin(angle)


def _reference_lambda_attention(q, k, v, sinks, window, limit):
    """Glaciohound/LM-Infinite (models/llama.py with models/lambda_attention.py), one query at a time:
    keys with 0 <= i - j < local_branch at their rotated positions; the first global_branch keys
    beyond it unrotated (position 0) against the query rotated by limit_distance; one softmax."""
    b, t, h, _ = q.shape
    out = np.zeros_like(v)
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                keys, logits = [], []
                for j in range(i + 1):
                    if i - j < window:
                        logits.append(_rotated(q[bi, i, hi], i) @ _rotated(k[bi, j, hi], j))
                    elif j < sinks:
                        logits.append(_rotated(q[bi, i, hi], min(limit, t - 1)) @ k[bi, j, hi])
                    else:
                        continue
                    keys.append(j)
                logits = np.array(logits) / math.sqrt(D)
                p = np.exp(logits - logits.max())
                out[bi, i, hi] = (p / p.sum()) @ v[bi, keys, hi]
    return out


@pytest.mark.parametrize("sinks,window,limit", [(3, L, L), (2, 5, 5), (2, 5, L)],
                         ids=["window L", "window 5 (convert_llama_model: limit = window)", "window 5, limit L"])
def test_lambda_attention_is_the_references_dense_and_blockwise(sinks, window, limit):
    """The reference with the authors' convert_llama_model (limit_distance = local_branch, the window)
    and with a limit_distance of its own (their LLAMA_Model's argument; model.attention_sink_distance)."""
    scheme = posenc.build(posenc.default_config("rope"), DIMS, rngs=nnx.Rngs(0))
    q, k, v = (jax.random.normal(key, (2, T, 2, D)) for key in jax.random.split(jax.random.key(0), 3))
    pos = jnp.broadcast_to(jnp.arange(T), (2, T))
    mask = LambdaMask(sinks=sinks, window=window, limit=limit)
    expected = _reference_lambda_attention(*(np.asarray(a, np.float64) for a in (q, k, v)), sinks, window, limit)
    np.testing.assert_allclose(lambda_dense_attention(q, k, v, pos, pos, scheme, mask), expected, atol=2e-5)
    np.testing.assert_allclose(blockwise_call(q, k, v, Call(pos, pos, scheme, mask=mask, block=4)), expected, atol=2e-5)


def _scan_lengths(jaxpr) -> set[int]:
    """The lengths of every scan in a jaxpr and its sub-jaxprs (lax.map is a scan too)."""
    found = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.add(eqn.params["length"])
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                found |= _scan_lengths(getattr(inner, "jaxpr", inner))
    return found


def test_blockwise_visits_only_the_window_tiles_and_sinks_are_seen_from_distance_l():
    scheme = posenc.build(posenc.default_config("alibi"), DIMS, rngs=nnx.Rngs(0))
    q = jnp.zeros((1, 64, 2, D))
    pos = jnp.arange(64)[None]
    mask = LambdaMask(sinks=2, window=L, limit=L)
    assert mask.window_tiles(4) == 3 and mask.window_tiles(8) == 2 and mask.window_tiles(16) == 2
    traced = {m: jax.make_jaxpr(lambda q: blockwise_call(q, q, q, Call(pos, pos, scheme, mask=m, block=4)))(q).jaxpr
              for m in (None, mask)}
    assert _scan_lengths(traced[None]) == {16}      # 16 query tiles, each against 16 key tiles
    assert _scan_lengths(traced[mask]) == {16, 3}   # ... against the 3 its window reaches
    # q = k = 0 and one-hot values: the output is the weights; a sink beyond the window gets ALiBi's
    # bias at distance L, whatever its own distance, the window its own distances
    v = jnp.broadcast_to(jnp.eye(64)[None, :, None, :], (1, 64, 2, 64))
    probs = np.asarray(lambda_dense_attention(q, q, v, pos, pos, scheme, mask))[0, 40]  # query 40: heads x keys
    slopes = np.asarray(posenc.alibi_slopes(2))[:, None]
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(probs[:, :2] / probs[:, 40:41], np.exp(-slopes * L).repeat(2, 1), rtol=1e-4)
    np.testing.assert_allclose(probs[:, 33:41] / probs[:, 40:41], np.exp(-slopes * np.arange(L)[::-1]), rtol=1e-4)
    assert np.all(probs[:, 2:33] == 0.0)


def test_paths_that_cannot_apply_the_mask_refuse_it_and_auto_avoids_them():
    base = dict(vocab_size=37, num_layers=1, d_model=16, num_heads=2, mlp_dim=32, attention_sinks=2)
    x = jax.random.randint(jax.random.key(1), (1, 12), 0, 37)
    for path in ("triangular", "fused", "pallas"):
        model = DecoderLM(ModelConfig(**base, attention=path), posenc.default_config("alibi"), 8, rngs=nnx.Rngs(0))
        with pytest.raises(ValueError, match="cannot apply the Lambda mask"):
            model(x)
    alibi = posenc.build(posenc.default_config("alibi"), DIMS, rngs=nnx.Rngs(0))
    positions = jnp.zeros((1, 12), jnp.int32)
    assert choice.choose(ModelConfig(**base), alibi, positions, jnp.float32, dropping=False) == "dense"  # not triangular
    assert choice.choose(ModelConfig(**base, attention_block=4), alibi, positions, jnp.float32,
                         dropping=False) == "blockwise"
    with pytest.raises(ValueError, match="does not implement attention dropout"):
        choice.choose(ModelConfig(**base), alibi, positions, jnp.float32, dropping=True)
    for name in ("cope", "stickbreaking"):
        model = DecoderLM(ModelConfig(**base), posenc.default_config(name), 8, rngs=nnx.Rngs(0))
        with pytest.raises(ValueError, match="Lambda mask .* cannot apply"):
            model(x)
    with pytest.raises(ValueError, match="must be >= 0"):
        ModelConfig.from_config({"attention_window": -1}, 37)


def test_the_mask_is_an_evaluation_override_of_any_run():
    """`--set model.attention_sinks=4` (and `attention_window`, `attention_sink_distance`) is taken at
    evaluation: no parameters. The sinks are seen from the window, as the authors' convert_llama_model
    does (issue 34: they were seen from L whatever the window); attention_sink_distance=L keeps that."""
    config = config_lib.resolve(tiny_config("rope"))
    changed = apply_overrides(config, {"model.attention_sinks": "4", "model.attention_window": "8"})
    assert (changed.model.attention_sinks, changed.model.attention_window) == (4, 8)
    assert lambda_mask(changed.model, 16) == LambdaMask(sinks=4, window=8, limit=8)
    former = apply_overrides(changed, {"model.attention_sink_distance": "16"})
    assert lambda_mask(former.model, 16) == LambdaMask(sinks=4, window=8, limit=16)
    assert lambda_mask(config.model, 16) is None and lambda_mask(apply_overrides(
        config, {"model.attention_sinks": "2"}).model, 16) == LambdaMask(sinks=2, window=16, limit=16)
    with pytest.raises(ValueError, match="attention_sink_distance must be 0 unless model.attention_sinks is set"):
        apply_overrides(config, {"model.attention_sink_distance": "16"})


@pytest.mark.slow  # ~15 s: a training run and four evaluations
def test_the_mask_switches_on_at_evaluation_with_set(tmp_path):
    """eval_extrapolate.py --set model.attention_sinks=4 on a trained run: the same numbers at L (the
    window is L), others at 4L, and the override recorded."""
    config = tiny_config("alibi")
    config.train.update(dict(steps=2, checkpoint_every=2))
    train(config, tmp_path)
    plain = evaluate(tmp_path, [16, 64], max_tokens=1024)
    masked = evaluate(tmp_path, [16, 64], max_tokens=1024, overrides={"model.attention_sinks": "4"})
    assert masked[0]["nll"] == pytest.approx(plain[0]["nll"], rel=1e-5)
    assert np.isfinite(masked[1]["nll"]) and abs(masked[1]["nll"] - plain[1]["nll"]) > 1e-4
    assert masked[1]["overrides"] == {"model.attention_sinks": "4"}
