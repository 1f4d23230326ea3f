"""Adaptive input / adaptive softmax: reduce to plain layers without cutoffs, normalise, tie, count."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.adaptive import AdaptiveInput, AdaptiveSoftmax

V, D, CUTOFFS, FACTOR = 50, 16, (10, 30), 2


class Pair(nnx.Module):
    """Input + softmax in one graph, so tied arrays are counted (and differentiated) once."""

    def __init__(self, vocab_size, d_model, cutoffs, factor, *, tie: bool, rngs: nnx.Rngs):
        self.inp = AdaptiveInput(vocab_size, d_model, cutoffs, factor, rngs=rngs)
        self.sm = AdaptiveSoftmax(vocab_size, d_model, cutoffs, factor, rngs=rngs,
                                  tie_to=self.inp if tie else None)


def n_params(module) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


def hidden(seed=0, shape=(2, 7, D)):
    return jax.random.normal(jax.random.key(seed), shape)


def test_no_cutoffs_input_with_identity_projection_is_a_plain_embedding():
    inp = AdaptiveInput(V, D, (), FACTOR, rngs=nnx.Rngs(0))
    inp.projs[0].kernel[...] = jnp.eye(D)
    plain = nnx.Embed(V, D, rngs=nnx.Rngs(1))
    plain.embedding[...] = inp.embeds[0].embedding[...]
    tokens_BxT = jax.random.randint(jax.random.key(2), (3, 9), 0, V)
    np.testing.assert_allclose(inp(tokens_BxT), plain(tokens_BxT), atol=1e-6)


@pytest.mark.parametrize("tie", [False, True])
def test_no_cutoffs_softmax_is_a_plain_output_layer(tie):
    pair = Pair(V, D, (), FACTOR, tie=tie, rngs=nnx.Rngs(0))
    sm = pair.sm
    plain = nnx.Linear(D, V, use_bias=False, rngs=nnx.Rngs(1))
    plain.kernel[...] = sm.tables[0][...].T
    h_BxTxD = hidden()
    expected_BxTxV = jax.nn.log_softmax(plain(h_BxTxD), axis=-1)
    np.testing.assert_allclose(sm.log_probs(h_BxTxD), expected_BxTxV, atol=1e-5)
    targets_BxT = jax.random.randint(jax.random.key(3), h_BxTxD.shape[:2], 0, V)
    ce_BxT = -jnp.take_along_axis(expected_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(sm.nll(h_BxTxD, targets_BxT), ce_BxT, atol=1e-5)
    if tie:  # the same as a tied embedding's `attend`
        np.testing.assert_allclose(sm.log_probs(h_BxTxD),
                                   jax.nn.log_softmax(pair.inp.embeds[0].attend(h_BxTxD), -1), atol=1e-5)


@pytest.mark.parametrize("tie", [False, True])
def test_log_probs_normalise_and_nll_matches_them_for_every_word(tie):
    sm = Pair(V, D, CUTOFFS, FACTOR, tie=tie, rngs=nnx.Rngs(0)).sm
    h_BxTxD = 3.0 * hidden(1, (2, V, D))
    lp_BxTxV = sm.log_probs(h_BxTxD)
    assert lp_BxTxV.shape == (2, V, V)
    np.testing.assert_allclose(jnp.exp(lp_BxTxV).sum(-1), 1.0, atol=1e-5)
    # Each row's targets are a permutation of the vocabulary, so every word is checked.
    targets_BxT = jnp.stack([jnp.arange(V), jax.random.permutation(jax.random.key(2), V)])
    expected_BxT = -jnp.take_along_axis(lp_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(sm.nll(h_BxTxD, targets_BxT), expected_BxT, atol=1e-4, rtol=1e-5)
    jitted = nnx.jit(lambda m, h, t: m.nll(h, t))
    np.testing.assert_allclose(jitted(sm, h_BxTxD, targets_BxT), expected_BxT, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("tie", [False, True])
def test_gradients_reach_every_band_and_projection(tie):
    pair = Pair(V, D, CUTOFFS, FACTOR, tie=tie, rngs=nnx.Rngs(0))
    # Inputs and targets both cover the head and both tail clusters.
    tokens_BxT = jnp.stack([jnp.arange(V), jnp.arange(V)[::-1]])
    targets_BxT = jnp.roll(tokens_BxT, 7, axis=1)

    def loss(model):
        return model.sm.nll(jnp.tanh(model.inp(tokens_BxT)), targets_BxT).mean()

    grads = nnx.jit(nnx.grad(loss))(pair)
    flat = nnx.to_flat_state(grads)
    n_leaves = 6 + (1 if tie else 1 + 3 + 2)  # input tables+projs, clusters, untied tables+tail projs
    assert len(flat) == n_leaves
    for path, g in flat:
        assert float(jnp.abs(g[...]).max()) > 0, f"zero gradient for {path}"


def test_tied_softmax_shares_the_input_arrays():
    tied = Pair(V, D, CUTOFFS, FACTOR, tie=True, rngs=nnx.Rngs(0))
    untied = Pair(V, D, CUTOFFS, FACTOR, tie=False, rngs=nnx.Rngs(0))
    inp, sm = tied.inp, tied.sm
    for i in range(3):
        assert sm.tables[i] is inp.embeds[i].embedding
    for i in (1, 2):
        assert sm.tail_projs[i - 1] is inp.projs[i].kernel
    h_BxTxD = hidden(4)
    before = sm.log_probs(h_BxTxD)
    inp.projs[0].kernel[...] = 2.0 * inp.projs[0].kernel[...]  # the head projection is not shared
    np.testing.assert_array_equal(sm.log_probs(h_BxTxD), before)
    # (A constant shift of the whole table would cancel in the softmax: perturb it randomly.)
    inp.embeds[1].embedding[...] = inp.embeds[1].embedding[...] + hidden(5, (20, D // FACTOR))
    after = sm.log_probs(h_BxTxD)
    assert not np.allclose(after[..., 10:30], before[..., 10:30])
    # Only the cluster logits (D x n_clusters) are the softmax's own parameters.
    assert n_params(tied) == n_params(inp) + D * len(CUTOFFS)
    assert n_params(tied) < n_params(untied)


def test_parameter_count_of_the_wiki103_model():
    vocab, d, cutoffs, factor = 267_744, 1024, (20_000, 60_000), 4
    pair = nnx.eval_shape(lambda: Pair(vocab, d, cutoffs, factor, tie=True, rngs=nnx.Rngs(0)))
    # Tables: 20000*1024 + 40000*256 + 207744*64     = 44_015_616 (shared with the softmax)
    # Input projections: (1024 + 256 + 64) * 1024    =  1_376_256 (tail ones shared, transposed)
    # Softmax cluster logits: 1024 * 2               =      2_048
    expected = 20_000 * 1024 + 40_000 * 256 + 207_744 * 64 + (1024 + 256 + 64) * 1024 + 1024 * 2
    assert expected == 45_393_920
    assert n_params(pair) == expected
    # 16 pre-LN layers (attention with biases, FFN 4096, two LayerNorms) and the final LayerNorm.
    layers = 16 * (4 * d * d + 4 * d + 2 * d * 4096 + 4096 + d + 4 * d) + 2 * d
    assert layers == 201_541_632
    assert abs(expected + layers - 247e6) / 247e6 < 0.01  # Baevski & Auli / Press et al.: 247M
    untied = nnx.eval_shape(lambda: Pair(vocab, d, cutoffs, factor, tie=False, rngs=nnx.Rngs(0)))
    assert n_params(untied) == expected + 44_015_616 + (256 + 64) * 1024


def test_bad_configurations_fail_clearly():
    with pytest.raises(ValueError, match="increase strictly"):
        AdaptiveInput(V, D, (30, 10), FACTOR, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="increase strictly"):
        AdaptiveInput(V, D, (10, V), FACTOR, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="empty band"):
        AdaptiveInput(V, 4, (10, 20, 30), 2, rngs=nnx.Rngs(0))
    inp = AdaptiveInput(V, D, CUTOFFS, FACTOR, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="tie_to"):
        AdaptiveSoftmax(V, D, (10, 20), FACTOR, rngs=nnx.Rngs(0), tie_to=inp)


def _grads(loss, sm, h_BxTxD):
    grads_sm, grads_h = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(sm, h_BxTxD)
    return [g[...] for _, g in nnx.to_flat_state(grads_sm)] + [grads_h]


@pytest.mark.parametrize("case", ["fits", "overflows"])
@pytest.mark.parametrize("tie", [False, True])
def test_nll_scoring_tails_in_slots_equals_scoring_every_token(case, tie):
    """Training scores a tail cluster only for the tokens whose target it holds (8 slots per row of
    32 here); a batch with a row needing more falls back to every token. Loss and gradients equal
    the every-token computation either way, called on the batch or row by row under vmap (as the
    training step does, each row with its own dropout key), jitted."""
    from models.adaptive import tail_slots
    pair = Pair(V, D, CUTOFFS, FACTOR, tie=tie, rngs=nnx.Rngs(0))
    every = Pair(V, D, CUTOFFS, FACTOR, tie=tie, rngs=nnx.Rngs(0))
    pair.sm.tail_capacity, every.sm.tail_capacity = 0.25, 0.0
    b, t = 3, 32
    assert tail_slots(t, 0.25) == 8 and tail_slots(t, 0.0) == 0
    head_BxT = jax.random.randint(jax.random.key(3), (b, t), 0, CUTOFFS[0])
    any_BxT = jax.random.randint(jax.random.key(4), (b, t), 0, V)
    share = 0.25 if case == "fits" else 0.9  # of tokens drawn from the whole vocabulary
    targets_BxT = jnp.where(jax.random.uniform(jax.random.key(5), (b, t)) < share, any_BxT, head_BxT)
    per_cluster = [((targets_BxT >= lo) & (targets_BxT < hi)).sum(1) for lo, hi in ((10, 30), (30, V))]
    assert all(int(c.min()) > 0 for c in per_cluster)  # every row scores both clusters
    assert (max(int(c.max()) for c in per_cluster) > 8) == (case == "overflows")
    h_BxTxD = 3.0 * hidden(6, (b, t, D))

    def batch_loss(sm, h):
        return sm.nll(h, targets_BxT).mean()

    def row_loss(sm, h):
        return jax.vmap(lambda x, y: sm.nll(x[None], y[None])[0])(h, targets_BxT).mean()

    expected_BxT = nnx.jit(lambda sm, h: sm.nll(h, targets_BxT))(every.sm, h_BxTxD)
    np.testing.assert_allclose(nnx.jit(lambda sm, h: sm.nll(h, targets_BxT))(pair.sm, h_BxTxD), expected_BxT,
                               rtol=1e-6, atol=1e-6)
    expected = _grads(batch_loss, every.sm, h_BxTxD)
    for loss in (batch_loss, row_loss):
        for g, e in zip(_grads(loss, pair.sm, h_BxTxD), expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)


def test_tail_slots_alone_are_exact_only_when_no_row_overflows_and_vmap_keeps_the_branch():
    """The slot path scores only the first `slots` in-cluster tokens of a row (so the fallback is
    what makes an overflowing batch exact), and the overflow test answers for the whole vmapped
    batch, so under the training step's per-row vmap the choice stays a branch (a `cond`) instead
    of a select that would compute the every-token side too."""
    from models.adaptive import _tail_nll_by_chunks, _tail_nll_every_token, _tail_nll_in_slots, tail_nll
    sm = AdaptiveSoftmax(V, D, CUTOFFS, FACTOR, rngs=nnx.Rngs(0))
    proj, table = sm.tail_projs[0][...], sm.tables[1][...]
    h_BxTxD = hidden(7, (2, 16, D))
    targets_BxT = jnp.stack([jnp.full(16, 12), jnp.arange(16) * 3])  # row 0: 16 in [10, 30); row 1: 7
    every_BxT = _tail_nll_every_token(h_BxTxD, targets_BxT, proj, table, 10, 30, jnp.float32)
    slots_BxT = _tail_nll_in_slots(h_BxTxD, targets_BxT, proj, table, 10, 30, 8, jnp.float32)
    np.testing.assert_allclose(slots_BxT[1], every_BxT[1], rtol=1e-6)  # 7 fit in 8 slots
    np.testing.assert_allclose(slots_BxT[0, :8], every_BxT[0, :8], rtol=1e-6)
    np.testing.assert_array_equal(slots_BxT[0, 8:], 0.0)  # the 9th and later were not scored
    np.testing.assert_allclose(tail_nll(h_BxTxD, targets_BxT, proj, table, 10, 30, 8), every_BxT, rtol=1e-6)
    # the fallback scores every token a chunk at a time, the last one padded
    chunked_BxT = _tail_nll_by_chunks(h_BxTxD, targets_BxT, proj, table, 10, 30, 6, jnp.float32)
    np.testing.assert_allclose(chunked_BxT, every_BxT, rtol=1e-6)

    def rows(h):
        return jax.vmap(lambda x, y: tail_nll(x[None], y[None], proj, table, 10, 30, 8)[0])(h, targets_BxT).sum()
    np.testing.assert_allclose(jax.jit(rows)(h_BxTxD), every_BxT.sum(), rtol=1e-6)
    assert "cond[" in str(jax.make_jaxpr(jax.grad(rows))(h_BxTxD))
