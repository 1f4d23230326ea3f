"""CoPE: the bias is q . (interpolated embedding of the gated count); blockwise by carried gate sums."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.attention import choice
from models.config import ModelConfig
from posenc.cope import contextual_positions
from tests.posenc.helpers import CFG, DIMS, build_with as build, positions


def _naive_cope_bias(q, k, table):
    """The paper's formulas, one (query, key) pair at a time."""
    b, t, h, d = q.shape
    out = np.zeros((b, h, t, t))
    rows = table.shape[0]
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                gates = [1 / (1 + math.exp(-q[bi, i, hi] @ k[bi, s, hi] / math.sqrt(d))) for s in range(i + 1)]
                for j in range(i + 1):
                    p = min(sum(gates[j:i + 1]), rows - 1)
                    lo, hi_ = math.floor(p), min(math.ceil(p), rows - 1)
                    e = (1 - (p - lo)) * table[lo] + (p - lo) * table[hi_]
                    out[bi, hi, i, j] = q[bi, i, hi] @ e
    return out


@pytest.mark.parametrize("rows", [0, 4])
def test_cope_bias_is_q_dot_interpolated_embedding_of_the_gated_count(rows):
    scheme = build("cope", cope__max_positions=rows)
    q = np.asarray(jax.random.normal(jax.random.key(0), (2, 7, 2, 8)), np.float64)
    k = np.asarray(jax.random.normal(jax.random.key(1), (2, 7, 2, 8)), np.float64)
    pos = positions(2, 7)
    got = np.asarray(scheme.bias(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), pos, pos))
    expected = _naive_cope_bias(q, k, np.asarray(scheme.table[...], np.float64))
    causal = np.tril(np.ones((7, 7), bool))
    np.testing.assert_allclose(got[..., causal], expected[..., causal], atol=1e-5)


def test_cope_positions_count_gates_and_integer_counts_hit_table_rows():
    gates = jnp.asarray([[[[1.0, 1.0, 0.0, 1.0]]]])
    np.testing.assert_allclose(contextual_positions(gates)[0, 0, 0], [3, 2, 1, 1])
    scheme = build("cope")
    z = jnp.arange(12.0).reshape(1, 1, 1, 12)
    from posenc.cope import interpolate_logits
    np.testing.assert_allclose(interpolate_logits(z, jnp.asarray([[[[0.0, 2.0, 2.25, 11.0]]]])),
                               [[[[0.0, 2.0, 2.25, 11.0]]]])
    assert scheme.traits.needs_full_rows and posenc.get("cope").traits.per_layer


@pytest.mark.parametrize("wrapper", [None, "logn", "randomized"])
def test_cope_runs_blockwise_by_carrying_gate_sums_also_inside_a_wrapper(wrapper):
    """auto at 40 > 2 tiles of 8 goes blockwise (cope's carried_bias, passed through by wrappers)."""
    cfg = posenc.default_config(wrapper or "cope")
    if wrapper:
        cfg[wrapper].base = "cope"
    x = jax.random.randint(jax.random.key(0), (1, 40), 0, CFG.vocab_size)
    auto = DecoderLM(ModelConfig(**{**CFG.__dict__, "attention_block": 8}), cfg, train_length=16, rngs=nnx.Rngs(0))
    dense = DecoderLM(ModelConfig(**{**CFG.__dict__, "attention": "dense"}), cfg, train_length=16,
                      rngs=nnx.Rngs(0))
    assert not auto.scheme.traits.needs_whole_rows
    np.testing.assert_allclose(auto(x), dense(x), atol=1e-5)


def test_blockwise_refuses_a_whole_row_bias_it_cannot_carry():
    class WholeRows(posenc.Scheme):
        name = "whole_rows"
        traits = posenc.Traits(needs_full_rows=True)  # and no carried_bias

    scheme = WholeRows(None, DIMS, rngs=nnx.Rngs(0))
    assert scheme.traits.needs_whole_rows
    explicit = dataclasses.replace(CFG, attention="blockwise", attention_block=4)
    with pytest.raises(ValueError, match="'whole_rows' needs whole rows.*attention=dense"):
        choice.choose(explicit, scheme, positions(1, 12), jnp.float32, dropping=False)
    auto = dataclasses.replace(explicit, attention="auto")  # auto at 12 > 2 tiles of 4 keeps whole rows
    assert choice.choose(auto, scheme, positions(1, 12), jnp.float32, dropping=False) == "dense"
