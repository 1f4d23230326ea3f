"""The Pallas kernel's dropout mask (models/attention/pallas_kernels.keep_mask: a hash per query and
per key, 5 integer operations per logit) has the statistics of independent draws: its keep rate,
the correlations between the masks of two rows, of two keys and of two heads, and the parity of
2 x 2 squares, each within what independent Bernoulli draws of the same size give. One multiply per
logit (the first form tried) fails the row test: some pairs of rows correlate at ~0.3."""
import jax
import jax.numpy as jnp
import numpy as np

from models.attention.pallas_kernels import keep_mask

ROWS, KEYS, RATE = 256, 2048, 0.25


def _mask(seed: int, sequence: int = 0, head: int = 0, rate: float = RATE) -> np.ndarray:
    keep = keep_mask(jnp.uint32(seed), jnp.int32(sequence), jnp.int32(head), 8, jnp.arange(ROWS)[:, None],
                     jnp.arange(KEYS)[None, :], rate)
    return np.asarray(keep, np.float64)


def _correlations(x: np.ndarray) -> np.ndarray:
    """The correlations between every two rows of x (off the diagonal)."""
    z = x - x.mean(axis=1, keepdims=True)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    c = z @ z.T
    return c[~np.eye(len(c), dtype=bool)]


def test_the_keep_rate_is_the_requested_one():
    for rate in (0.1, 0.25, 0.5):
        keep = _mask(11, rate=rate)
        sigma = np.sqrt(rate * (1 - rate) / keep.size)
        assert abs(keep.mean() - (1 - rate)) < 5 * sigma
        per_row, per_key = keep.mean(axis=1), keep.mean(axis=0)  # no row or key kept more than chance allows
        assert np.all(np.abs(per_row - (1 - rate)) < 6 * np.sqrt(rate * (1 - rate) / KEYS))
        assert np.all(np.abs(per_key - (1 - rate)) < 6 * np.sqrt(rate * (1 - rate) / ROWS))


def test_rows_keys_and_heads_are_as_uncorrelated_as_independent_draws():
    rng = np.random.default_rng(0)
    independent = (rng.random((ROWS, KEYS)) >= RATE).astype(np.float64)
    null_rows, null_keys = _correlations(independent), _correlations(independent.T[:ROWS])
    for seed in (1, 2):
        keep = _mask(seed)
        rows, keys = _correlations(keep), _correlations(keep.T[:ROWS])
        assert rows.std() < 1.1 * null_rows.std() and np.abs(rows).max() < 1.3 * np.abs(null_rows).max()
        assert keys.std() < 1.1 * null_keys.std() and np.abs(keys).max() < 1.3 * np.abs(null_keys).max()
    heads = np.stack([_mask(3, sequence=s, head=h).ravel() for s in range(2) for h in range(4)])
    assert np.abs(_correlations(heads)).max() < 5 / np.sqrt(heads.shape[1])  # every (sequence, head): its own
    assert np.abs(_correlations(np.stack([_mask(s).ravel() for s in (4, 5, 6)]))).max() < 5 / np.sqrt(ROWS * KEYS)


def test_two_by_two_squares_have_the_parity_of_independent_draws():
    """A row hash xor a key hash alone would make every 2 x 2 square's parity fixed by its corners'
    hashes; the per-logit multiplies must leave it at independent draws' rate, 1/2 - (1 - 2p)^4 / 2."""
    keep = _mask(8)
    odd = (keep[:-1, :-1] + keep[1:, :-1] + keep[:-1, 1:] + keep[1:, 1:]) % 2
    p = 1 - RATE
    want = (1 - (1 - 2 * p) ** 4) / 2
    assert abs(odd.mean() - want) < 5 * np.sqrt(want * (1 - want) / odd.size)
    far = (keep[:-7, :-9] + keep[7:, :-9] + keep[:-7, 9:] + keep[7:, 9:]) % 2  # squares of other sides too
    assert abs(far.mean() - want) < 5 * np.sqrt(want * (1 - want) / far.size)


def test_the_mask_is_a_function_of_the_absolute_indices():
    """The kernels draw it tile by tile: any tile of it equals that part of the whole."""
    whole = _mask(9)
    tile = keep_mask(jnp.uint32(9), jnp.int32(0), jnp.int32(0), 8, jnp.arange(64, 128)[:, None],
                     jnp.arange(512, 576)[None, :], RATE)
    np.testing.assert_array_equal(np.asarray(tile, np.float64), whole[64:128, 512:576])
    assert jax.eval_shape(lambda: tile).dtype == jnp.bool_
