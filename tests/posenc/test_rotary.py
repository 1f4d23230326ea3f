"""RoPE (scores depend only on m - n), its evaluation-time extensions (PI, NTK, dynamic NTK, YaRN,
ReRoPE), p-RoPE and xPos."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.config import ModelConfig
from posenc.rope_scaling import RopeOptions, ntk_base

CFG = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64)
TRAIN_LENGTH = 16


def rope_cfg(name="rope", **options):
    cfg = posenc.default_config(name)
    cfg[name].update(options)
    return cfg


def build(name="rope", head_dim=16, heads=2, train_length=TRAIN_LENGTH, **options):
    dims = posenc.ModelDims(d_model=head_dim * heads, num_heads=heads, head_dim=head_dim, num_layers=1,
                            train_length=train_length)
    return posenc.build(rope_cfg(name, **options), dims, rngs=nnx.Rngs(0))


def qk(t=1, s=1, heads=2, head_dim=16, seed=0):
    kq, kk = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kq, (1, t, heads, head_dim)), jax.random.normal(kk, (1, s, heads, head_dim))


def closed_form_theta(d, base=10000.0):
    return np.array([base ** (-2 * i / d) for i in range(d // 2)])


# --- RoPE ------------------------------------------------------------------------------------------

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


# --- inverse frequencies against closed forms ------------------------------------------------------

def test_pi_frequencies_closed_form():
    got = posenc.scaled_inverse_frequencies(RopeOptions(pi_factor=0.25), 8, 64)
    np.testing.assert_allclose(got, 0.25 * closed_form_theta(8), rtol=1e-6)


def test_ntk_frequencies_closed_form():
    d, alpha = 8, 4.0
    got = posenc.scaled_inverse_frequencies(RopeOptions(ntk_alpha=alpha), d, 64)
    base = 10000.0 * alpha ** (d / (d - 2))
    np.testing.assert_allclose(got, [base ** (-2 * i / d) for i in range(d // 2)], rtol=1e-5)
    assert got[0] == 1.0  # the highest frequency is untouched, the lowest is divided by alpha
    np.testing.assert_allclose(got[-1], closed_form_theta(d)[-1] / alpha, rtol=1e-5)


def test_yarn_frequencies_hand_computed():
    # d = 8, base 1e4: theta = 1, 0.1, 0.01, 0.001. Over L = 64 theta_i makes 32 turns at index
    # 8 ln(64 / (2 pi 32)) / (2 ln 1e4) = -0.50 (rounded down: -1, clipped to 0) and 1 turn at
    # 8 ln(64 / (2 pi)) / (2 ln 1e4) = 1.008 (rounded up: 2). gamma = 1 - clip(i / 2) = 1, 0.5, 0, 0.
    got = posenc.scaled_inverse_frequencies(RopeOptions(yarn_scale=4.0), 8, 64)
    np.testing.assert_allclose(got, [1.0, 0.1 * (0.5 / 4 + 0.5), 0.01 / 4, 0.001 / 4], rtol=1e-6)


@pytest.mark.parametrize("d,train,s,fast,slow", [(32, 64, 16.0, 32.0, 1.0), (128, 4096, 16.0, 32.0, 1.0),
                                                 (64, 2048, 2.0, 32.0, 1.0), (16, 512, 8.0, 16.0, 2.0),
                                                 (128, 8192, 4.0, 32.0, 1.0)])
def test_yarn_frequencies_follow_the_authors_code(d, train, s, fast, slow):
    """The reference's recipe, written out: correction indices floor / ceil, clipped to [0, d - 1],
    a linear ramp over the d/2 pair indices, theta_i blended between theta_i / s and theta_i."""
    def index(turns):
        return d * math.log(train / (turns * 2 * math.pi)) / (2 * math.log(10000.0))
    low, high = max(math.floor(index(fast)), 0), min(math.ceil(index(slow)), d - 1)
    high = high + 0.001 if high == low else high
    expected = []
    for i, theta in enumerate(closed_form_theta(d)):
        keep = 1.0 - min(max((i - low) / (high - low), 0.0), 1.0)
        expected.append(theta / s * (1 - keep) + theta * keep)
    got = posenc.scaled_inverse_frequencies(RopeOptions(yarn_scale=s, yarn_beta_fast=fast, yarn_beta_slow=slow),
                                            d, train)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_yarn_paper_ramp_is_linear_in_turns():
    d, train, s, slow, fast = 16, 1024, 8.0, 1.0, 32.0
    got = np.asarray(posenc.scaled_inverse_frequencies(RopeOptions(yarn_scale=s, yarn_ramp="turns"), d, train))
    expected, gammas = [], []
    for theta in closed_form_theta(d):
        r = train / (2 * math.pi / theta)
        gamma = 0.0 if r < slow else 1.0 if r > fast else (r - slow) / (fast - slow)
        gammas.append(gamma)
        expected.append((1 - gamma) * theta / s + gamma * theta)
    assert gammas[0] == 1.0 and gammas[-1] == 0.0 and any(0 < g < 1 for g in gammas)  # all regimes
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_yarn_temperature():
    expected = (0.1 * math.log(16) + 1) ** 2  # sqrt(1/t) = 0.1 ln(s) + 1
    assert posenc.yarn_mscale(RopeOptions(yarn_scale=16.0)) ** 2 == pytest.approx(expected)  # 1/t, on the logit
    assert posenc.yarn_mscale(RopeOptions(yarn_scale=16.0, yarn_temperature=False)) == 1.0
    assert posenc.yarn_mscale(RopeOptions()) == 1.0


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_yarn_temperature_scales_the_rotated_features_only(fraction):
    """As the authors' code (cos and sin times 0.1 ln s + 1): with partial rotary the unrotated
    features, and their part of the logit, are left alone."""
    mscale = 0.1 * math.log(4.0) + 1
    q, k = qk(t=6, s=6)
    pos = jnp.arange(6)[None] + 20
    hot = build(yarn_scale=4.0, fraction=fraction).rotate(q, k, pos, pos)
    cold = build(yarn_scale=4.0, fraction=fraction, yarn_temperature=False).rotate(q, k, pos, pos)
    rotated = int(16 * fraction)
    for a, b in zip(hot, cold):
        np.testing.assert_allclose(a[..., :rotated], mscale * b[..., :rotated], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(a[..., rotated:], b[..., rotated:])
    assert build(yarn_scale=4.0).logit_scale(pos, pos) is None  # not the whole logit


def test_dynamic_ntk_frequencies():
    d, train = 8, 64
    options = RopeOptions(dynamic_ntk=True)
    within = posenc.scaled_inverse_frequencies(options, d, train, jnp.array([1, 64]))
    np.testing.assert_array_equal(within, np.broadcast_to(posenc.rope_inverse_frequencies(d), (2, d // 2)))
    beyond = posenc.scaled_inverse_frequencies(options, d, train, jnp.array([192]))
    static = posenc.scaled_inverse_frequencies(RopeOptions(ntk_alpha=3.0), d, train)
    np.testing.assert_allclose(beyond[0], static, rtol=1e-5)


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_dynamic_ntk_factor_as_hf(factor):
    """HF's dynamic NTK: base * (f * n / L - (f - 1))^(d / (d - 2)) for a window of n > L."""
    d, train, n = 8, 64, 160
    got = posenc.scaled_inverse_frequencies(RopeOptions(dynamic_ntk=True, dynamic_ntk_factor=factor), d, train,
                                            jnp.array([n, 40]))
    base = 10000.0 * (factor * n / train - (factor - 1)) ** (d / (d - 2))
    np.testing.assert_allclose(got[0], [base ** (-2 * i / d) for i in range(d // 2)], rtol=1e-5)
    np.testing.assert_allclose(got[1], closed_form_theta(d), rtol=1e-6)  # within L: plain RoPE


def test_neutral_settings_are_plain_rope_exactly():
    plain = posenc.rope_inverse_frequencies(16)
    for options in (RopeOptions(pi_factor=1.0), RopeOptions(yarn_scale=1.0, yarn_beta_slow=2.0),
                    RopeOptions(ntk_alpha=1.0)):
        np.testing.assert_array_equal(posenc.scaled_inverse_frequencies(options, 16, 64), plain)
    assert ntk_base(10000.0, 1.0, 16) == 10000.0
    q, k = qk(t=5, s=5)
    pos = jnp.arange(5)[None] * 3  # within the training length, where dynamic NTK is plain RoPE
    reference = build().rotate(q, k, pos, pos)
    for options in (dict(pi_factor=1.0), dict(ntk_alpha=1.0), dict(yarn_scale=1.0), dict(dynamic_ntk=True)):
        got = build(**options).rotate(q, k, pos, pos)
        for a, b in zip(got, reference):
            np.testing.assert_array_equal(a, b)


def test_pi_is_rope_at_scaled_positions():
    q, k = qk(t=4, s=4)
    pos = jnp.arange(4)[None] * 3
    scaled = build(pi_factor=0.25).rotate(q, k, pos, pos)
    plain = build().rotate(q, k, pos.astype(jnp.float32) * 0.25, pos.astype(jnp.float32) * 0.25)
    for a, b in zip(scaled, plain):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


# --- p-RoPE -----------------------------------------------------------------------------------------

def gemma_apply_rope(x, positions, rope_proportion, base_frequency=10000.0):
    """google-deepmind/gemma's `apply_rope` (gemma/gm/math/_positional_embeddings.py), written out in
    numpy: the first int(p H // 2) pairs turn at timescales base^(2i/H), the others at timescale inf."""
    head_dim = x.shape[-1]
    rope_angles = int(rope_proportion * head_dim // 2)
    nope_angles = head_dim // 2 - rope_angles
    timescale = np.concatenate([base_frequency ** (2.0 * np.arange(rope_angles) / head_dim),
                                np.full(nope_angles, np.inf)])
    sinusoid_inp = (positions[..., None] / timescale[None, None, :])[..., None, :]
    sin, cos = np.sin(sinusoid_inp), np.cos(sinusoid_inp)
    first_half, second_half = np.split(x, 2, axis=-1)
    return np.concatenate([first_half * cos - second_half * sin, second_half * cos + first_half * sin], axis=-1)


def test_p_rope_rotates_as_gemmas_apply_rope():
    q, k = qk(t=6, s=6)
    pos = jnp.arange(6)[None] * 7
    for got, x in zip(build(p_rope=0.6).rotate(q, k, pos, pos), (q, k)):  # 0.6 x 16 // 2: 4 pairs rotate
        np.testing.assert_allclose(got, gemma_apply_rope(np.asarray(x, np.float64), np.asarray(pos, np.float64), 0.6),
                                   rtol=1e-5, atol=1e-5)
    inv_freq = np.asarray(posenc.scaled_inverse_frequencies(RopeOptions(p_rope=0.25), 16, 64))
    np.testing.assert_allclose(inv_freq, np.r_[closed_form_theta(16)[:2], np.zeros(6)], rtol=1e-6)
    # not partial rotary, which keeps the first features at frequencies spread over them
    assert not np.allclose(inv_freq[:2], posenc.scaled_inverse_frequencies(RopeOptions(fraction=0.25), 4, 64))


# --- xPos -------------------------------------------------------------------------------------------

def pair_scores(q, k, d):
    """Per-pair dot products of rotated q and k in the rotate-half layout: ... x d/2."""
    h = d // 2
    return q[..., :h] * k[..., :h] + q[..., h:d] * k[..., h:d]


@pytest.mark.parametrize("name", ["xpos", "rope"])
def test_xpos_score_is_rope_score_times_zeta_power(name):
    d, gamma = 16, 512.0
    xpos = build(name, xpos=True) if name == "rope" else build(name)
    rope = build()
    q, k = qk()
    zeta = np.asarray(posenc.xpos_zeta(d, 0.4))
    np.testing.assert_allclose(zeta, [(i / (d / 2) + 0.4) / 1.4 for i in range(d // 2)], rtol=1e-6)
    for m, n in [(5, 2), (3, 3), (700, 100), (1000, 40)]:
        qm, kn = jnp.array([[m]]), jnp.array([[n]])
        qx, kx = xpos.rotate(q, k, qm, kn)
        qr, kr = rope.rotate(q, k, qm, kn)
        got = np.asarray(pair_scores(qx, kx, d))[0, 0]
        expected = np.asarray(pair_scores(qr, kr, d))[0, 0] * zeta ** ((m - n) / gamma)
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5)
        total = lambda a, b: np.asarray(jnp.einsum("bthk,bshk->bh", a, b))
        for shift in (1, 333):
            np.testing.assert_allclose(total(qx, kx), total(*xpos.rotate(q, k, qm + shift, kn + shift)),
                                       rtol=2e-4, atol=2e-4)


# --- ReRoPE -----------------------------------------------------------------------------------------

def logits_through_hooks(scheme, q, k, pos):
    qr, kr = scheme.rotate(q, k, pos, pos)
    logits = jnp.einsum("bthk,bshk->bhts", qr, kr) * q.shape[-1] ** -0.5
    scale = scheme.logit_scale(pos, pos)
    if scale is not None:
        logits = logits * scale
    bias = scheme.bias(qr, kr, pos, pos)
    return logits if bias is None else logits + bias


@pytest.mark.parametrize("options", [dict(), dict(yarn_scale=4.0), dict(fraction=0.5)])
def test_rerope_clamps_relative_position(options):
    w, t = 3, 9
    scheme = build(rerope_window=w, **options)
    plain = build(**options)
    q, k = qk(t, t)
    pos = jnp.arange(t)[None] + 5
    got = np.asarray(logits_through_hooks(scheme, q, k, pos))
    inv_freq = posenc.scaled_inverse_frequencies(plain.options, plain.rotary_dim, TRAIN_LENGTH)
    scale = posenc.yarn_mscale(plain.options) ** 2 / math.sqrt(16)
    for m in range(t):
        for n in range(m + 1):
            rel = min(m - n, w)
            q_rel = posenc.apply_rotary(q[:, m:m + 1], jnp.array([[rel]]), inv_freq)
            expected = np.asarray(jnp.einsum("bthk,bshk->bh", q_rel, k[:, n:n + 1]))[0] * scale
            np.testing.assert_allclose(got[0, :, m, n], expected, rtol=1e-4, atol=1e-5)
    near = np.asarray(logits_through_hooks(plain, q, k, pos))
    mask = (np.arange(t)[:, None] - np.arange(t)[None, :]) <= w
    np.testing.assert_array_equal(got[0][:, mask], near[0][:, mask])


def test_rerope_bias_tile_is_block_of_full_bias():
    scheme = build(rerope_window=2)
    q, k = qk(10, 10)
    pos = jnp.arange(10)[None]
    qr, kr = scheme.rotate(q, k, pos, pos)
    full = scheme.bias(qr, kr, pos, pos)
    qt, kt = scheme.rotate(q[:, 6:9], k[:, 1:5], pos[:, 6:9], pos[:, 1:5])
    tile = scheme.bias(qt, kt, pos[:, 6:9], pos[:, 1:5])
    np.testing.assert_allclose(full[:, :, 6:9, 1:5], tile, atol=1e-5)


# --- in the decoder: causality, prefixes, no new parameters ------------------------------------------

VARIANTS = [dict(pi_factor=0.5), dict(ntk_alpha=2.0), dict(dynamic_ntk=True), dict(yarn_scale=4.0),
            dict(yarn_scale=4.0, fraction=0.5), dict(rerope_window=3), dict(xpos=True)]


def model(**options):
    return DecoderLM(CFG, rope_cfg(**options), train_length=TRAIN_LENGTH, rngs=nnx.Rngs(0))


def tokens(t, seed=0):
    return jax.random.randint(jax.random.key(seed), (2, t), 0, CFG.vocab_size)


@pytest.fixture(scope="module")
def plain_logits():
    return model()(tokens(12))


@pytest.mark.parametrize("options", VARIANTS, ids=lambda o: ",".join(o))
def test_variant_is_causal_and_prefix_consistent(options, plain_logits):
    lm = model(**options)
    x = tokens(12)
    full = lm(x)
    changed = x.at[:, 6:].set((x[:, 6:] + 5) % CFG.vocab_size)
    np.testing.assert_allclose(lm(changed)[:, :6], full[:, :6], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(lm(x[:, :7]), full[:, :7], atol=1e-5, rtol=1e-5)
    if "dynamic_ntk" not in options:  # dynamic NTK is plain RoPE within the training length
        assert not np.allclose(full, plain_logits, atol=1e-4)  # the option does change the model


def test_options_add_no_parameters():
    shapes = lambda m: jax.tree.map(jnp.shape, nnx.state(m, nnx.Param))
    plain = shapes(model())
    for options in VARIANTS:
        assert shapes(model(**options)) == plain
    assert shapes(DecoderLM(CFG, posenc.default_config("xpos"), TRAIN_LENGTH, rngs=nnx.Rngs(0))) == plain


def test_dynamic_ntk_beyond_training_length_is_ntk_with_window_alpha():
    q, k = qk(24, 24)
    pos = jnp.arange(24)[None]
    dynamic = build(dynamic_ntk=True).rotate(q, k, pos, pos)
    static = build(ntk_alpha=24 / TRAIN_LENGTH).rotate(q, k, pos, pos)
    for a, b in zip(dynamic, static):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options, match", [
    (dict(yarn_scale=0.5), "yarn_scale"), (dict(dynamic_ntk=True, ntk_alpha=2.0), "ntk_alpha"),
    (dict(rerope_window=4, xpos=True), "rerope_window"),
    (dict(rerope_window=4, dynamic_ntk=True), "dynamic_ntk"),
    (dict(pi_factor=0.0), "pi_factor"), (dict(p_rope=1.5), "p_rope"),
    (dict(yarn_beta_slow=40.0), "yarn_beta_slow")])
def test_meaningless_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        build(**options)


def test_rerope_and_yarn_through_blockwise_attention_equal_dense():
    options = dict(rerope_window=5, yarn_scale=4.0)
    x = tokens(40)
    outs = []
    for attention in ("dense", "blockwise"):
        cfg = ModelConfig(**{**CFG.__dict__, "attention": attention, "attention_block": 16})
        outs.append(DecoderLM(cfg, rope_cfg(**options), train_length=TRAIN_LENGTH, rngs=nnx.Rngs(0))(x))
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5, rtol=1e-5)
