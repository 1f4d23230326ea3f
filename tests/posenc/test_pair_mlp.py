"""The per-pair MLP of FIRE and DAPE (posenc/pair_mlp.py) against the formula written out, whole and in
chunks of query rows (a chunk size that does not divide the rows: padding), with an input shared by
every row; gradients equal whole and chunked; FIRE's bias computed once for rows with equal positions
equals the bias of each row."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import pair_mlp
from tests.posenc.helpers import build_bias as build, set_param


def _inputs():
    keys = jax.random.split(jax.random.key(0), 6)
    scores = jax.random.normal(keys[0], (2, 3, 7, 5))     # B x F x T x S
    shared = jax.random.normal(keys[1], (1, 3, 7, 5))     # one row for every row of the batch
    w1a, w1b = jax.random.normal(keys[2], (3, 4)), jax.random.normal(keys[3], (3, 4))
    b1, w2 = jax.random.normal(keys[4], (4,)), jax.random.normal(keys[5], (4, 2))
    return (scores, shared), (w1a, w1b), b1, w2


def _by_loops(inputs, w1s, b1, w2, slope):
    """The formula pair by pair in numpy (activation: leaky ReLU of `slope`)."""
    x = np.concatenate([np.broadcast_to(np.asarray(i), (2, 3, 7, 5)) for i in inputs], axis=1)  # B x 2F x T x S
    w1 = np.concatenate([np.asarray(w) for w in w1s])
    out = np.zeros((2, w2.shape[1], 7, 5))
    for b in range(2):
        for t in range(7):
            for s in range(5):
                pre = x[b, :, t, s] @ w1 + np.asarray(b1)
                out[b, :, t, s] = np.where(pre > 0, pre, slope * pre) @ np.asarray(w2)
    return out


@pytest.mark.parametrize("limit", [None, 1, 2 * 5 * 4 * 3])  # whole; a row a chunk; 3 rows a chunk (7 -> 9)
def test_pair_mlp_is_the_formula_whole_and_in_chunks_of_rows(limit):
    inputs, w1s, b1, w2 = _inputs()
    got = jax.jit(lambda inputs: pair_mlp.apply(inputs, w1s, b1, w2, lambda x: jax.nn.leaky_relu(x, 0.1),
                                                limit=limit))(inputs)
    np.testing.assert_allclose(got, _by_loops(inputs, w1s, b1, w2, 0.1), rtol=1e-5, atol=1e-5)
    assert pair_mlp.rows_per_chunk(7, 10, 4, 2 * 5 * 4 * 3) == 3 and pair_mlp.rows_per_chunk(7, 10, 4, 1) == 1


def test_pair_mlp_gradients_are_the_same_whole_and_in_chunks():
    inputs, w1s, b1, w2 = _inputs()

    def loss(limit):
        def f(inputs, w1s, b1, w2):
            return (jnp.sin(pair_mlp.apply(inputs, w1s, b1, w2, jax.nn.relu, limit=limit))).sum()
        return jax.grad(f, argnums=(0, 1, 2, 3))(inputs, w1s, b1, w2)
    for whole, chunked in zip(jax.tree.leaves(loss(None)), jax.tree.leaves(loss(40))):
        np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)


def test_fire_bias_for_rows_of_equal_positions_is_each_rows_bias():
    """FIRE computes its bias once where every row has the same positions (lax.cond): equal to the
    bias of each row computed alone, and rows with different positions get their own."""
    scheme = build("fire", heads=2, hidden=4, threshold_init=4.0)
    set_param(scheme.c, 0.7)
    same = jnp.broadcast_to(jnp.arange(6), (3, 6))
    moved = same.at[1].add(5)
    for pos in (same, moved):
        bias = np.asarray(scheme.bias(None, None, pos, pos))
        for b in range(3):
            alone = np.asarray(scheme.bias(None, None, pos[b:b + 1], pos[b:b + 1]))[0]
            np.testing.assert_allclose(bias[b], alone, rtol=1e-6, atol=1e-6)
    assert not np.allclose(np.asarray(scheme.bias(None, None, moved, moved))[1],
                           np.asarray(scheme.bias(None, None, moved, moved))[0])


def test_the_fast_forms_are_a_run_time_branch_off_a_gpu_and_the_general_form_on_one(monkeypatch):
    """posenc/fast_form.py: on a CPU FIRE's bias branches on whether the rows' positions are alike; on a
    GPU (where a conditional may read its predicate on the host) only the general form is traced, and
    gives the same bias."""
    import jax
    from posenc import fast_form
    scheme = build("fire", heads=2, hidden=4, threshold_init=4.0)
    pos = jnp.broadcast_to(jnp.arange(6), (3, 6))
    here = scheme.bias(None, None, pos, pos)
    assert "cond" in str(jax.make_jaxpr(lambda p: scheme.bias(None, None, p, p))(pos))
    monkeypatch.setattr(fast_form.jax, "default_backend", lambda: "gpu")
    assert "cond" not in str(jax.make_jaxpr(lambda p: scheme.bias(None, None, p, p))(pos))
    np.testing.assert_allclose(scheme.bias(None, None, pos, pos), here, rtol=1e-6, atol=1e-6)
