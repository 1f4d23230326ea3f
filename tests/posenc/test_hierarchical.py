"""Hierarchical decomposition of a learned table (Su): n rows give n^2 positions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc
from tests.posenc.helpers import build_embedding as build, embed_zeros


def test_hierarchical_extends_the_learned_table():
    n, alpha = 4, 0.4
    scheme = build("hierarchical", train_length=n)
    table = np.asarray(jax.random.normal(jax.random.key(1), (n, 16)))
    scheme.table[...] = jnp.asarray(table)
    positions = jnp.arange(n * n)
    out = embed_zeros(scheme, positions)
    np.testing.assert_array_equal(out[:n], table)  # exactly the learned rows
    q = (table - alpha * table[0]) / (1 - alpha)  # Su's construction, 1-based in the post
    for p in range(n * n):
        i, j = divmod(p, n)
        np.testing.assert_allclose(out[p], alpha * q[i] + (1 - alpha) * q[j], rtol=1e-5, atol=1e-5)
    assert len({tuple(np.round(r, 5)) for r in out}) == n * n  # all n^2 positions distinct
    scheme.check_length(n * n)
    with pytest.raises(posenc.LengthError) as err:
        scheme.check_length(n * n + 1)
    message = str(err.value)
    assert "hierarchical" in message and "16" in message and "17" in message
    assert "--config.posenc.hierarchical.max_length=5" in message
    with pytest.raises(ValueError, match="alpha"):
        build("hierarchical", alpha=1.0)
