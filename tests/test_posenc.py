"""The registry and the defining property of each scheme."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc

FIRST_SCHEMES = {"nope", "learned", "sinusoidal", "rope", "alibi", "t5"}


def test_registry_lists_schemes_and_rejects_unknown_names():
    assert FIRST_SCHEMES <= set(posenc.names())
    assert posenc.names() == sorted(posenc.names())
    with pytest.raises(ValueError) as err:
        posenc.get("alibee")
    for name in posenc.names():
        assert name in str(err.value)


def test_build_rejects_unknown_option():
    cfg = posenc.default_config("rope")
    cfg.rope.unlisted = 3
    dims = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_length=8)
    with pytest.raises(ValueError, match="unlisted.*base"):
        posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def _official_slopes(n):
    """The recipe of the ALiBi paper's code, written from its description (reference/README.md):
    a geometric sequence starting at 2^(-8/n) with that ratio; non-powers of two take the closest
    lower power's list plus every other slope of the doubled list."""
    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + _official_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", range(1, 33))
def test_alibi_slopes_are_the_official_ones(heads):
    np.testing.assert_allclose(posenc.alibi_slopes(heads), _official_slopes(heads), rtol=1e-12)


def test_alibi_slopes_published_examples():
    np.testing.assert_allclose(posenc.alibi_slopes(8), [2.0 ** -k for k in range(1, 9)])
    np.testing.assert_allclose(posenc.alibi_slopes(16)[:2], [2 ** -0.5, 2 ** -1.0])


def test_alibi_bias_is_minus_slope_times_distance():
    dims = posenc.ModelDims(d_model=16, num_heads=4, head_dim=4, num_layers=1, train_length=8)
    scheme = posenc.build(posenc.default_config("alibi"), dims, rngs=nnx.Rngs(0))
    pos = jnp.arange(6)[None]
    bias = np.asarray(scheme.bias(None, None, pos, pos))[0]
    slopes = posenc.alibi_slopes(4)
    for h in range(4):
        for i in range(6):
            for j in range(i + 1):
                assert bias[h, i, j] == pytest.approx(-slopes[h] * (i - j))


def test_t5_bucket_table():
    expected = [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11,
                11, 11, 11, 11]
    distance = np.arange(31)  # i - j: the key is `distance` positions before the query
    got = posenc.t5_relative_position_bucket(-distance, bidirectional=True, num_buckets=32, max_distance=128)
    assert np.asarray(got).tolist() == expected
    future = posenc.t5_relative_position_bucket(distance[1:], bidirectional=True)
    assert (np.asarray(future) >= 16).all()  # keys after the query use the other half
    assert int(posenc.t5_relative_position_bucket(-1000, bidirectional=True)) == 15
    assert int(posenc.t5_relative_position_bucket(-1000, bidirectional=False)) == 31


def test_sinusoidal_default_is_fairseqs_table_from_position_2():
    """fairseq SinusoidalPositionalEmbedding.get_embedding, written out: h = d/2,
    emb[p, i] = sin(p * exp(-i log(10000)/(h-1))), emb[p, h+i] = cos(same); token t at p = t + 2."""
    d = 12
    h = d // 2
    dims = posenc.ModelDims(d_model=d, num_heads=2, head_dim=6, num_layers=1, train_length=8)
    scheme = posenc.build(posenc.default_config("sinusoidal"), dims, rngs=nnx.Rngs(0))
    assert scheme.options.layout == "fairseq"
    tokens = [0, 1, 5, 40]
    out = np.asarray(scheme.embed(jnp.zeros((1, 4, d)), jnp.asarray([tokens])))[0]
    for row, t in enumerate(tokens):
        p = t + 2
        for i in range(h):
            w = math.exp(-i * math.log(10000) / (h - 1))
            assert out[row, i] == pytest.approx(math.sin(p * w), abs=1e-5)
            assert out[row, h + i] == pytest.approx(math.cos(p * w), abs=1e-5)
    odd = np.asarray(posenc.fairseq_sinusoidal_table(jnp.arange(3), 7))
    assert odd.shape == (3, 7) and (odd[:, 6] == 0).all()
    vaswani = posenc.default_config("sinusoidal")
    vaswani.sinusoidal.layout = "vaswani"
    plain = posenc.build(vaswani, dims, rngs=nnx.Rngs(0)).embed(jnp.zeros((1, 4, d)), jnp.asarray([tokens]))
    np.testing.assert_array_equal(plain[0], posenc.sinusoidal_table(jnp.asarray(tokens), d))
    with pytest.raises(ValueError, match="layout=vaswani"):
        posenc.build(posenc.default_config("sinusoidal"),
                     posenc.ModelDims(d_model=2, num_heads=1, head_dim=2, num_layers=1, train_length=8),
                     rngs=nnx.Rngs(0))


def test_sinusoidal_matches_vaswani_formula():
    d, positions = 16, np.arange(50)
    table = np.asarray(posenc.sinusoidal_table(jnp.asarray(positions), d))
    for pos in positions:
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_scores_depend_only_on_offset(fraction):
    dims = posenc.ModelDims(d_model=32, num_heads=2, head_dim=16, num_layers=1, train_length=8)
    cfg = posenc.default_config("rope")
    cfg.rope.fraction = fraction
    scheme = posenc.build(cfg, dims, rngs=nnx.Rngs(0))
    q = jax.random.normal(jax.random.key(0), (1, 1, 2, 16))
    k = jax.random.normal(jax.random.key(1), (1, 1, 2, 16))

    def score(m, n):
        qr, kr = scheme.rotate(q, k, jnp.array([[m]]), jnp.array([[n]]))
        return np.asarray(jnp.einsum("bthk,bshk->bh", qr, kr))

    for m, n in [(5, 2), (3, 3), (0, 7)]:
        for shift in (1, 17, 1000):
            np.testing.assert_allclose(score(m, n), score(m + shift, n + shift), rtol=2e-4, atol=2e-4)
    assert not np.allclose(score(5, 2), score(5, 3), atol=1e-3)


def test_rope_inverse_frequencies_closed_form():
    got = np.asarray(posenc.rope_inverse_frequencies(8, 10000.0))
    np.testing.assert_allclose(got, [10000 ** (-2 * i / 8) for i in range(4)], rtol=1e-6)


def test_learned_table_refuses_longer_lengths_and_names_the_option():
    dims = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_length=32)
    scheme = posenc.build(posenc.default_config("learned"), dims, rngs=nnx.Rngs(0))
    scheme.check_length(32)
    with pytest.raises(posenc.LengthError) as err:
        scheme.check_length(64)
    message = str(err.value)
    assert "learned" in message and "32" in message and "64" in message
    assert "--config.posenc.learned.max_length=64" in message


@pytest.mark.parametrize("name", posenc.names())
def test_every_scheme_documents_itself(name):
    cls = posenc.get(name)
    assert cls.__doc__ and len(cls.__doc__) > 60, "docstring with the formula and the citation"
    assert cls.family and cls.citation
    assert cls.extrapolates in ("yes", "partly", "with option", "no")


def test_readme_scheme_table_is_generated_from_the_registry():
    from posenc import catalogue
    from tests.conftest import REPO
    readme = (REPO / "README.md").read_text()
    block = readme.split(catalogue.START)[1].split(catalogue.END)[0].strip()
    assert block == catalogue.markdown_table(), "run: python -m posenc.catalogue --write README.md"
