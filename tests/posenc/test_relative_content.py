"""Content-dependent relative schemes (Shaw, Transformer-XL, DeBERTa, TUPE): each one's defining
formula, checked against explicit loops over (head, query, key)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.attention import blockwise_attention, dense_attention
from models.config import ModelConfig

H, K, D = 2, 4, 8
NAMES = ["shaw", "transformer_xl", "deberta", "tupe"]


def build(name, train_length=16, **options):
    cfg = posenc.default_config(name)
    cfg[name].update(options)
    dims = posenc.ModelDims(d_model=D, num_heads=H, head_dim=K, num_layers=1, train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def qk(t=6, s=None, seed=0):
    s = t if s is None else s
    q = jax.random.normal(jax.random.key(seed), (1, t, H, K))
    k = jax.random.normal(jax.random.key(seed + 1), (1, s, H, K))
    return q, k


def test_registered_with_citation_family_and_options():
    for name in NAMES:
        cls = posenc.get(name)
        assert cls.citation and cls.family
    assert posenc.get("shaw").Options().max_relative_position == 16
    assert posenc.get("deberta").Options().max_relative_positions == 512
    assert posenc.get("tupe").Options().max_length == 0
    assert all(posenc.get(n).traits.per_layer for n in ("shaw", "transformer_xl", "deberta"))
    assert not posenc.get("tupe").traits.per_layer  # shared by all layers, as in the paper


def test_shaw_bias_and_value_term_by_loops():
    kmax = 2
    scheme = build("shaw", max_relative_position=kmax)
    q, _ = qk()
    pos = jnp.arange(6)[None] + 3
    bias = np.asarray(scheme.bias(q, None, pos, pos))[0]
    rk, rv = np.asarray(scheme.key_table[...]), np.asarray(scheme.value_table[...])
    qn = np.asarray(q)[0]
    probs = np.asarray(jax.random.uniform(jax.random.key(5), (1, H, 6, 6)))
    value = np.asarray(scheme.value_bias(jnp.asarray(probs), pos, pos))[0]
    for h in range(H):
        for i in range(6):
            expected_value = np.zeros(K)
            for j in range(6):
                r = min(max(j - i, -kmax), kmax) + kmax
                assert bias[h, i, j] == pytest.approx(qn[i, h] @ rk[r] / math.sqrt(K), abs=1e-5)
                expected_value += probs[0, h, i, j] * rv[r]
            np.testing.assert_allclose(value[i, h], expected_value, atol=1e-5)


def test_shaw_is_shift_invariant_and_clipped():
    scheme = build("shaw", max_relative_position=2)
    q, k = qk()
    pos = jnp.arange(6)[None]
    np.testing.assert_allclose(scheme.bias(q, k, pos, pos), scheme.bias(q, k, pos + 1000, pos + 1000), atol=1e-6)
    bias = np.asarray(scheme.bias(q, k, pos, pos))[0]
    np.testing.assert_allclose(bias[:, 5, 0], bias[:, 5, 2], atol=1e-6)  # distances 5 and 3 both clip to 2


def _txl_reference(scheme, q, k, qpos, kpos):
    w_r, u, v = (np.asarray(x[...], np.float64) for x in (scheme.w_r, scheme.u, scheme.v))
    f = D // 2
    omega = 10000.0 ** (-2.0 * np.arange(f) / D)
    qn, kn = np.asarray(q, np.float64)[0], np.asarray(k, np.float64)[0]
    out = np.zeros((H, len(qpos), len(kpos)))
    for h in range(H):
        for a, i in enumerate(qpos):
            for b, j in enumerate(kpos):
                r_vec = np.concatenate([np.sin((i - j) * omega), np.cos((i - j) * omega)])
                wr = r_vec @ w_r[:, h]  # W_R R_{i-j}, head h
                out[h, a, b] = (qn[a, h] @ wr + u[h] @ kn[b, h] + v[h] @ wr) / math.sqrt(K)
    return out


def test_transformer_xl_terms_b_c_d_by_loops():
    scheme = build("transformer_xl")
    q, k = qk(5, 7)
    qpos, kpos = np.arange(5) + 20, np.arange(7) + 14
    bias = np.asarray(scheme.bias(q, k, jnp.asarray(qpos)[None], jnp.asarray(kpos)[None]))[0]
    np.testing.assert_allclose(bias, _txl_reference(scheme, q, k, qpos, kpos), atol=1e-5)


def test_transformer_xl_at_far_positions_is_accurate():
    """The identity is evaluated relative to the tile's first query, so far positions stay exact."""
    scheme = build("transformer_xl")
    q, k = qk(4)
    pos = np.arange(4)
    near = np.asarray(scheme.bias(q, k, jnp.asarray(pos)[None], jnp.asarray(pos)[None]))
    far = np.asarray(scheme.bias(q, k, jnp.asarray(pos + 100_000)[None], jnp.asarray(pos + 100_000)[None]))
    np.testing.assert_allclose(far, near, atol=1e-5)


def _released_deberta_p2c(key_c, query_rel, kmax):
    """microsoft/DeBERTa `disentangled_att_bias`, p2c part, one head, step by step (numpy):
    relative_pos[i, j] = i - j; p2c_pos = clamp(-relative_pos + k, 0, 2k - 1); p2c_att = K^c Q^r^T
    (rows: keys); gathered[a, b] = p2c_att[a, p2c_pos[a, b]]; the result is gathered transposed."""
    n = key_c.shape[0]
    relative_pos = np.arange(n)[:, None] - np.arange(n)[None, :]
    p2c_pos = np.clip(-relative_pos + kmax, 0, 2 * kmax - 1)
    p2c_att = key_c @ query_rel.T
    gathered = np.take_along_axis(p2c_att, p2c_pos, axis=-1)
    return gathered.T


@pytest.mark.parametrize("kmax", [3, 8])  # 3: distances clipped (a gather); 8: none (the diagonal read)
@pytest.mark.parametrize("p2c_index", ["code", "paper"])
def test_deberta_c2p_p2c_and_scaling_by_loops(p2c_index, kmax):
    scheme = build("deberta", max_relative_positions=kmax, p2c_index=p2c_index)
    q, k = qk(7)
    pos = jnp.arange(7)[None]
    bias = np.asarray(scheme.bias(q, k, pos, pos))[0]
    p = np.asarray(scheme.table[...], np.float64)
    kr = np.einsum("rd,dhk->rhk", p, np.asarray(scheme.w_k[...]))
    qr = np.einsum("rd,dhk->rhk", p, np.asarray(scheme.w_q[...]))
    qn, kn = np.asarray(q)[0], np.asarray(k)[0]

    def delta(i, j):
        if i - j <= -kmax:
            return 0
        if i - j >= kmax:
            return 2 * kmax - 1
        return i - j + kmax
    for h in range(H):
        released_p2c = _released_deberta_p2c(kn[:, h].astype(np.float64), qr[:, h], kmax)
        for i in range(7):
            for j in range(7):
                p2c_row = delta(i, j) if p2c_index == "code" else delta(j, i)  # code vs the paper's Eq. 4
                p2c = kn[j, h] @ qr[p2c_row, h]
                expected = (qn[i, h] @ kr[delta(i, j), h] + p2c) / math.sqrt(3 * K)
                assert bias[h, i, j] == pytest.approx(expected, abs=1e-5)
                if p2c_index == "code":
                    assert p2c == pytest.approx(released_p2c[i, j], abs=1e-5)
    # content: attention's q.k/sqrt(d) times logit_scale is q.k/sqrt(3d)
    assert float(scheme.logit_scale(pos, pos)) / math.sqrt(K) == pytest.approx(1 / math.sqrt(3 * K))


def _gathered_products(x, rel, pos_a, pos_c, sign, low, high):
    """_relative_products' definition, as a gather: x[b, a, h] . rel[clip(sign (pos_a - pos_c), low, high) - low, h]."""
    index = np.clip(sign * (np.asarray(pos_a)[:, :, None] - np.asarray(pos_c)[:, None, :]), low, high) - low
    rows = np.asarray(rel)[index]  # B x A x C x H x K
    return np.einsum("bahk,bachk->bhac", np.asarray(x), rows)


@pytest.mark.parametrize("case,sign", [("contiguous", 1), ("contiguous", -1), ("offset", 1), ("clipped", -1),
                                       ("rows differ", 1), ("not contiguous", -1), ("wider", 1)])
def test_relative_products_read_along_diagonals_equal_the_gather_with_gradients(case, sign):
    """Issue 35: DeBERTa's relative terms read along diagonals (slices, no gather, whose gradient is a
    slow scatter on a CPU) where positions are shared and contiguous and nothing is clipped; otherwise
    the gather. Values and gradients equal the gather's in every case."""
    from posenc.relative_content import _relative_products
    a, c, low, high = 5, 7, -8, 7
    pos_a = np.broadcast_to(np.arange(a), (2, a)).copy()
    pos_c = np.broadcast_to(np.arange(c), (2, c)).copy()
    if case == "offset":
        pos_a += 3
    elif case == "clipped":
        pos_a += 9
    elif case == "rows differ":
        pos_a[1] += 1
    elif case == "not contiguous":
        pos_c[:, -1] += 2
    elif case == "wider":
        low, high = -4, 3  # the A + C - 1 diagonals exceed the table's 8 rows
    x = jax.random.normal(jax.random.key(0), (2, a, H, K))
    rel = jax.random.normal(jax.random.key(1), (high - low + 1, H, K))
    got = _relative_products(x, rel, jnp.asarray(pos_a), jnp.asarray(pos_c), sign, low, high)
    np.testing.assert_allclose(got, _gathered_products(x, rel, pos_a, pos_c, sign, low, high), rtol=1e-5, atol=1e-5)
    weights = jax.random.normal(jax.random.key(2), got.shape)

    def loss(x, rel):
        return (_relative_products(x, rel, jnp.asarray(pos_a), jnp.asarray(pos_c), sign, low, high) * weights).sum()

    def loss_gathered(x, rel):
        index = jnp.clip(sign * (jnp.asarray(pos_a)[:, :, None] - jnp.asarray(pos_c)[:, None, :]), low, high) - low
        return (jnp.einsum("bahk,bachk->bhac", x, rel[index]) * weights).sum()
    for ours, theirs in zip(jax.jit(jax.grad(loss, (0, 1)))(x, rel), jax.jit(jax.grad(loss_gathered, (0, 1)))(x, rel)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_tupe_untied_absolute_plus_t5_by_loops():
    scheme = build("tupe", max_length=10)
    q, k = qk(6)
    pos = jnp.arange(6)[None] + 2
    bias = np.asarray(scheme.bias(q, k, pos, pos))[0]
    p = np.asarray(scheme.table[...])
    uq, uk = np.asarray(scheme.u_q[...]), np.asarray(scheme.u_k[...])
    rel = np.asarray(scheme.relative_table[...])
    opts = scheme.options
    for h in range(H):
        for a in range(6):
            for b in range(6):
                i, j = a + 2, b + 2
                bucket = int(posenc.t5_relative_position_bucket(j - i, False, opts.num_buckets, opts.max_distance))
                expected = (p[i] @ uq[:, h]) @ (p[j] @ uk[:, h]) / math.sqrt(2 * K) + rel[bucket, h]
                assert bias[h, a, b] == pytest.approx(expected, abs=1e-5)
    assert float(scheme.logit_scale(pos, pos)) / math.sqrt(K) == pytest.approx(1 / math.sqrt(2 * K))
    assert build("tupe", relative=False).bias(q, k, pos, pos).shape == (1, H, 6, 6)


def test_tupe_refuses_lengths_beyond_its_table():
    scheme = build("tupe", train_length=16)
    scheme.check_length(16)
    with pytest.raises(posenc.LengthError, match="--config.posenc.tupe.max_length=17"):
        scheme.check_length(17)


@pytest.mark.parametrize("name", ["shaw", "transformer_xl", "deberta"])
def test_relative_schemes_evaluate_beyond_the_training_length(name):
    cfg = ModelConfig(vocab_size=37, num_layers=1, d_model=D, num_heads=H, mlp_dim=16)
    model = DecoderLM(cfg, posenc.default_config(name), train_length=8, rngs=nnx.Rngs(0))
    out = model(jax.random.randint(jax.random.key(0), (1, 40), 0, 37))
    assert out.shape == (1, 40, 37) and np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize("name", NAMES)
def test_hooks_tiled_equal_dense_with_gradients(name):
    """Blockwise attention (tiles of 4 over 10 tokens) equals dense, values and gradients, including
    Shaw's value term accumulated with unnormalised probabilities."""
    scheme = build(name, **({"max_relative_position": 3} if name == "shaw" else
                             {"max_relative_positions": 4} if name == "deberta" else {}))
    q, k = qk(10)
    v = jax.random.normal(jax.random.key(9), (1, 10, H, K))
    pos = jnp.arange(10)[None]
    mask = jnp.tril(jnp.ones((10, 10), bool))

    def loss(fn, q, k, v):
        return (fn(q, k, v) ** 2).sum()
    dense = lambda q, k, v: dense_attention(q, k, v, pos, pos, scheme, mask)
    tiled = lambda q, k, v: blockwise_attention(q, k, v, pos, pos, scheme, block_size=4)
    np.testing.assert_allclose(tiled(q, k, v), dense(q, k, v), atol=1e-5, rtol=1e-5)
    grads = jax.jit(jax.grad(loss, argnums=(1, 2, 3)), static_argnums=0)  # one program each (op by op: ~2x)
    for a, b in zip(grads(dense, q, k, v), grads(tiled, q, k, v)):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4)
