"""RoPE options that HF Llama-family checkpoints and training-free extension use: Llama 3 scaling,
LongRoPE and Self-Extend, each against a transcription of its reference written out here in numpy
(HF transformers' `_compute_llama3_parameters` / `_compute_longrope_parameters`, Meta's
`apply_scaling`; datamllab/LongLM's `self_extend_patch/Llama.py`)."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models.attention.paths import PATHS, CallSpec
from posenc.rope_scaling import RopeOptions, llama3_inverse_frequencies, longrope_mscale
from tests.posenc.helpers import (CFG, ROPE_TRAIN_LENGTH as TRAIN_LENGTH, build_rope as build, logits_through_hooks,
                                  numpy_rope, qk, rope_cfg, rope_model as model, tokens)

# --- the references, transcribed ---------------------------------------------------------------------

def torch_power(base, exponents_float32):
    """torch's float32 power of a number: correctly rounded (numpy's float32 power is not), i.e. the
    float64 power rounded to float32 (tests/models/test_hf.py checks it on transformers' own values)."""
    return (np.float64(base) ** np.asarray(exponents_float32, np.float64)).astype(np.float32)


def hf_default_inv_freq(dim, base):
    """HF's _compute_default_rope_parameters, in float32: 1 / base^(arange(0, dim, 2) / dim)."""
    return (np.float32(1.0) / torch_power(base, np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)
            ).astype(np.float32)


def hf_llama3(inv_freq, factor, low_freq_factor, high_freq_factor, old_context_len):
    """HF's _compute_llama3_parameters after the default frequencies (numpy float32, same order). A
    number divided by a torch tensor is the tensor's reciprocal times the number (Tensor.__rtruediv__),
    which rounds otherwise than numpy's division: written out so here."""
    inv_freq = np.asarray(inv_freq, np.float32)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rtruediv = lambda number, tensor: (np.float32(1) / tensor).astype(np.float32) * np.float32(number)
    wavelen = rtruediv(2 * math.pi, inv_freq)
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (rtruediv(old_context_len, wavelen) - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return np.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama), wavelen


def meta_apply_scaling(freqs, scale_factor, low_freq_factor, high_freq_factor, old_context_len):
    """meta-llama/llama-models' apply_scaling: the same rule, one frequency at a time (float64 here)."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new.append(freq)
        elif wavelen > low_freq_wavelen:
            new.append(freq / scale_factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new.append((1 - smooth) * freq / scale_factor + smooth * freq)
    return np.array(new)


def hf_longrope(dim, base, short_factor, long_factor, factor, original, seq_len, attention_factor=None):
    """HF's _compute_longrope_parameters (numpy float32): inverse frequencies and attention factor."""
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = np.array(long_factor if seq_len and seq_len > original else short_factor, np.float32)
    shape = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
    return (np.float32(1.0) / (ext * torch_power(base, shape))).astype(np.float32), attention_factor


def self_extend_reference(q_TxHxK, k_TxHxK, positions_T, inv_freq, group, window, mscale=1.0):
    """LongLM's self_extend_forward (prefill, q_len == kv_seq_len) up to the softmax: H x T x T
    logits, neighbour logits inside the authors' neighbour mask, grouped logits elsewhere (the
    upper triangle is masked by the caller)."""
    t, _, d = q_TxHxK.shape
    pos = np.asarray(positions_T)
    re_window = 0 if pos.max() < window else window
    group_q = pos // group + re_window - re_window // group
    group_k = pos // group
    logits = lambda qp, kp: np.einsum("thk,shk->hts", numpy_rope(q_TxHxK, qp, inv_freq, mscale),
                                      numpy_rope(k_TxHxK, kp, inv_freq, mscale)) / math.sqrt(d)
    neighbor, grouped = logits(pos, pos), logits(group_q, group_k)
    neighbor_mask = np.tril(np.ones((t, t)))
    if t - window > 0:
        neighbor_mask[window:, :-window] -= np.tril(np.ones((t - window, t - window)))
    return np.where(neighbor_mask.astype(bool), neighbor, grouped)


# --- Llama 3 -------------------------------------------------------------------------------------------

LLAMA3_CASES = [  # (rotary dim, base, factor, low, high, original length)
    (128, 500000.0, 8.0, 1.0, 4.0, 8192),    # Llama 3.1
    (64, 500000.0, 32.0, 1.0, 4.0, 8192),    # Llama 3.2 1B
    (16, 10000.0, 4.0, 1.0, 4.0, 64),        # small: every regime at d = 16
    (32, 10000.0, 2.0, 2.0, 8.0, 256),
    (128, 500000.0, 6.0, 1.5, 5.0, 8192),    # divisors that are not powers of 2
    (32, 10000.0, 16.0, 1.0, 4.0, 64),       # 2 pi / theta_3 rounds otherwise than torch's reciprocal x 2 pi
]


@pytest.mark.parametrize("d,base,factor,low,high,original", LLAMA3_CASES)
def test_llama3_frequencies_follow_hf(d, base, factor, low, high, original):
    options = RopeOptions(base=base, llama3_factor=factor, llama3_low_freq_factor=low,
                          llama3_high_freq_factor=high)
    got = np.asarray(posenc.scaled_inverse_frequencies(options, d, original))
    expected, wavelen = hf_llama3(hf_default_inv_freq(d, base), factor, low, high, original)
    np.testing.assert_allclose(got, expected, rtol=2e-6)
    np.testing.assert_allclose(got, meta_apply_scaling(hf_default_inv_freq(d, base).astype(np.float64), factor,
                                                       low, high, original), rtol=2e-6)
    # from the same theta, HF's float32 recipe gives our result bit for bit
    ours_plain = np.asarray(posenc.rope_inverse_frequencies(d, base))
    np.testing.assert_array_equal(got, hf_llama3(ours_plain, factor, low, high, original)[0])
    # compiled, XLA may contract a product and a sum into one fused multiply-add (as torch.compile may)
    jitted = jax.jit(posenc.scaled_inverse_frequencies, static_argnums=(0, 1, 2))(options, d, original)
    np.testing.assert_array_max_ulp(np.asarray(jitted), got, maxulp=1)
    if d == 16:  # all three regimes are exercised
        assert (wavelen < original / high).any() and (wavelen > original / low).any()
        assert (~(wavelen < original / high) & ~(wavelen > original / low)).any()


def test_llama3_hand_computed():
    # d = 8, base 1e4: theta = 1, 0.1, 0.01, 0.001, wavelengths 6.28, 62.8, 628, 6283; L = 1000, a = 1,
    # b = 4: kept below 250, divided above 1000, between: s = (1000 / 628.3 - 1) / 3 = 0.1972.
    got = np.asarray(posenc.scaled_inverse_frequencies(RopeOptions(llama3_factor=8.0), 8, 1000))
    s = (1000 / (2 * math.pi / 0.01) - 1) / 3
    np.testing.assert_allclose(got, [1.0, 0.1, (1 - s) * 0.01 / 8 + s * 0.01, 0.001 / 8], rtol=1e-5)


def test_llama3_uses_original_length_over_the_training_length():
    scheme = build(llama3_factor=8.0, original_length=64)
    q, k = qk(6, 6)
    pos = jnp.arange(6)[None] * 5
    inv_freq = llama3_inverse_frequencies(posenc.rope_inverse_frequencies(16), 8.0, 1.0, 4.0, 64)
    for a, b in zip(scheme.rotate(q, k, pos, pos), (posenc.apply_rotary(q, pos, inv_freq),
                                                    posenc.apply_rotary(k, pos, inv_freq))):
        np.testing.assert_array_equal(a, b)


def test_llama3_factor_one_is_plain_rope_exactly():
    plain = posenc.rope_inverse_frequencies(16)
    options = RopeOptions(llama3_factor=1.0, llama3_low_freq_factor=2.0, llama3_high_freq_factor=3.0)
    np.testing.assert_array_equal(posenc.scaled_inverse_frequencies(options, 16, 8), plain)
    q, k = qk(5, 5)
    pos = jnp.arange(5)[None] * 7
    for a, b in zip(build(llama3_factor=1.0).rotate(q, k, pos, pos), build().rotate(q, k, pos, pos)):
        np.testing.assert_array_equal(a, b)


# --- LongRoPE ------------------------------------------------------------------------------------------

def longrope_lists(d, seed=0):
    rng = np.random.default_rng(seed)
    short = (1.0 + rng.random(d // 2) * 0.2).tolist()
    long = np.cumsum(np.full(d // 2, 0.5)).tolist()
    return short, long


@pytest.mark.parametrize("d,base,factor,original", [(96, 10000.0, 32.0, 4096), (16, 10000.0, 4.0, 16),
                                                    (32, 500000.0, 1.0, 64)])
def test_longrope_frequencies_and_attention_factor_follow_hf(d, base, factor, original):
    short, long = longrope_lists(d)
    options = RopeOptions(base=base, longrope_short_factor=tuple(short), longrope_long_factor=tuple(long),
                          longrope_factor=factor)
    for seq_len in (original // 2, original, original + 1, 4 * original):
        expected, attention = hf_longrope(d, base, short, long, factor, original, seq_len)
        got = posenc.scaled_inverse_frequencies(options, d, original, jnp.array(seq_len))
        np.testing.assert_allclose(got, expected, rtol=2e-6)
        assert longrope_mscale(options, original) == pytest.approx(attention, rel=1e-12)
    # without a length: the short factors, as HF at initialisation
    np.testing.assert_allclose(posenc.scaled_inverse_frequencies(options, d, original),
                               hf_longrope(d, base, short, long, factor, original, None)[0], rtol=2e-6)
    if factor > 1:  # HF's default attention factor
        assert longrope_mscale(options, original) == math.sqrt(1 + math.log(factor) / math.log(original))
    else:
        assert longrope_mscale(options, original) == 1.0
    explicit = RopeOptions(longrope_short_factor=tuple(short), longrope_long_factor=tuple(long),
                           longrope_factor=factor, longrope_attention_factor=0.5)
    assert longrope_mscale(explicit, original) == 0.5


def test_longrope_picks_the_factors_per_row_and_scales_cos_and_sin():
    """Row 0 ends within L_train (short factors), row 1 beyond it (long factors); HF's attention
    factor multiplies the rotated features of q and k in both rows."""
    d, factor = 16, 8.0
    short, long = longrope_lists(d, seed=1)
    scheme = build(longrope_short_factor=short, longrope_long_factor=long, longrope_factor=factor)
    q, k = qk(6, 6, batch=2)
    pos = jnp.stack([jnp.arange(6) + TRAIN_LENGTH - 6, jnp.arange(6) + TRAIN_LENGTH - 5])  # last: 15, 16
    qr, kr = scheme.rotate(q, k, pos, pos)
    for row, (seq_len, name) in enumerate([(TRAIN_LENGTH, "short"), (TRAIN_LENGTH + 1, "long")]):
        inv_freq, attention = hf_longrope(d, 10000.0, short, long, factor, TRAIN_LENGTH, seq_len)
        for got, x in ((qr, q), (kr, k)):
            expected = numpy_rope(np.asarray(x[row]), np.asarray(pos[row]), inv_freq, attention)
            np.testing.assert_allclose(got[row], expected, rtol=1e-5, atol=1e-5, err_msg=name)


def test_longrope_all_ones_is_plain_rope_exactly():
    ones = [1.0] * 8
    q, k = qk(5, 5, batch=2)
    pos = jnp.stack([jnp.arange(5), jnp.arange(5) + 40])  # within and beyond L_train
    plain = build().rotate(q, k, pos, pos)
    for options in (dict(longrope_attention_factor=1.0, longrope_factor=16.0), dict()):
        got = build(longrope_short_factor=ones, longrope_long_factor=ones, **options).rotate(q, k, pos, pos)
        for a, b in zip(got, plain):
            np.testing.assert_array_equal(a, b)


def test_longrope_lists_survive_config_json():
    short, long = longrope_lists(16)
    cfg = rope_cfg(longrope_short_factor=short, longrope_long_factor=long, longrope_factor=4.0)
    assert isinstance(cfg.rope.longrope_short_factor, tuple)
    saved = json.loads(json.dumps(cfg.to_dict()))  # as config.json holds it: lists
    assert isinstance(saved["rope"]["longrope_short_factor"], list)
    dims = posenc.ModelDims(d_model=32, num_heads=2, head_dim=16, num_layers=1, train_length=TRAIN_LENGTH)
    from_json = posenc.build(saved, dims, rngs=nnx.Rngs(0))
    assert from_json.options.longrope_short_factor == tuple(short)
    hash(from_json.options)
    q, k = qk(4, 4)
    pos = jnp.arange(4)[None] + 30
    for a, b in zip(from_json.rotate(q, k, pos, pos), build(**cfg.rope.to_dict()).rotate(q, k, pos, pos)):
        np.testing.assert_array_equal(a, b)


# --- Self-Extend -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("window,group,options", [
    (4, 2, dict()), (6, 3, dict()), (5, 2, dict()),  # G does not divide W: the shift W - W // G
    (4, 4, dict(fraction=0.5)), (3, 2, dict(yarn_scale=4.0)), (4, 2, dict(llama3_factor=4.0, original_length=8)),
    (1, 2, dict(pi_factor=0.5))])
def test_self_extend_logits_equal_the_authors(window, group, options):
    t = 20
    scheme = build(self_extend_window=window, self_extend_group=group, **options)
    q, k = qk(t, t)
    for offset in (0, 9):
        pos = jnp.arange(t)[None] + offset
        got = np.asarray(logits_through_hooks(scheme, q, k, pos))[0]
        original = scheme.original_length
        inv_freq = np.asarray(posenc.scaled_inverse_frequencies(scheme.options, scheme.rotary_dim, original))
        expected = self_extend_reference(np.asarray(q[0]), np.asarray(k[0]), np.asarray(pos[0]), inv_freq,
                                         group, window, posenc.rope_mscale(scheme.options, original))
        causal = np.tril(np.ones((t, t), bool))
        np.testing.assert_allclose(got[:, causal], expected[:, causal], rtol=1e-4, atol=2e-5)
        grouped = causal & (np.arange(t)[:, None] - np.arange(t)[None, :] >= window)
        assert grouped.any()
        plain = np.asarray(logits_through_hooks(build(**options), q, k, pos))[0]
        np.testing.assert_array_equal(got[:, ~grouped], plain[:, ~grouped])  # the neighbour window is RoPE's


def test_self_extend_with_a_window_beyond_the_sequence_is_plain_rope():
    t = 12
    q, k = qk(t, t)
    pos = jnp.arange(t)[None] + 3
    plain = np.asarray(logits_through_hooks(build(), q, k, pos))
    for window in (t, t + 5):
        got = np.asarray(logits_through_hooks(build(self_extend_window=window, self_extend_group=4), q, k, pos))
        np.testing.assert_array_equal(got, plain)
    near = np.asarray(logits_through_hooks(build(self_extend_window=3, self_extend_group=1), q, k, pos))
    np.testing.assert_allclose(near, plain, atol=2e-5)  # G = 1: the grouped positions are the positions


@pytest.mark.parametrize("options,length,offset,rows,cols", [
    (dict(self_extend_window=3, self_extend_group=2), 12, 2, (7, 11), (1, 6)),
    (dict(dca_chunk_size=6, dca_local_window=2), 20, 7, (12, 18), (1, 9)),  # Dual Chunk Attention
], ids=["self_extend", "dca"])
def test_moved_positions_bias_tile_is_block_of_full_bias(options, length, offset, rows, cols):
    """Self-Extend's and DCA's bias (logits at moved positions minus the plain ones) of a tile is the
    block of the whole sequence's bias, at any position offset."""
    scheme = build(**options)
    q, k = qk(length, length)
    pos = jnp.arange(length)[None] + offset
    qr, kr = scheme.rotate(q, k, pos, pos)
    full = scheme.bias(qr, kr, pos, pos)
    (r0, r1), (c0, c1) = rows, cols
    tile = scheme.bias(qr[:, r0:r1], kr[:, c0:c1], pos[:, r0:r1], pos[:, c0:c1])
    np.testing.assert_allclose(full[:, :, r0:r1, c0:c1], tile, atol=1e-5)
    assert PATHS["pallas"].accepts(scheme.traits, CallSpec(scheme.name, length, 16, "float32"))  # a bias without bias_fn: refused


def test_self_extend_through_blockwise_and_triangular_attention_equals_dense():
    options = dict(self_extend_window=5, self_extend_group=3, yarn_scale=2.0)
    x = tokens(40)
    dense = model("dense", **options)(x)
    for attention in ("blockwise", "triangular"):
        np.testing.assert_allclose(model(attention, **options)(x), dense, atol=1e-5, rtol=1e-5)
    assert not np.allclose(dense, model("dense", yarn_scale=2.0)(x), atol=1e-4)


@pytest.mark.parametrize("options", [dict(self_extend_window=20, self_extend_group=3),
                                     dict(dca_chunk_size=24, dca_local_window=4), dict(rerope_window=18)],
                         ids=lambda o: next(iter(o)))
def test_a_tile_without_moved_pairs_skips_its_far_logits_and_changes_nothing(options, monkeypatch):
    """Blockwise attention's tiles where a move takes no pair (ReRoPE / Self-Extend near the diagonal,
    DCA's other chunk relations) skip its far logits (a lax.cond in Rope.bias); the output is
    bitwise that of computing them in every tile."""
    from models.attention import blockwise_attention
    scheme = build(**options)
    q, k = qk(64, 64, batch=2)
    v = jax.random.normal(jax.random.key(3), q.shape)
    pos = jnp.broadcast_to(jnp.arange(64, dtype=jnp.int32), (2, 64))
    skipped = [np.asarray(jax.jit(lambda q, k, v: blockwise_attention(q, k, v, pos, pos, scheme, block))(q, k, v))
               for block in (8, 12)]
    monkeypatch.setattr(jax.lax, "cond", lambda pred, yes, no, *args: yes(*args))  # every tile computes them
    every = [np.asarray(jax.jit(lambda q, k, v: blockwise_attention(q, k, v, pos, pos, scheme, block))(q, k, v))
             for block in (8, 12)]
    for a, b in zip(skipped, every):
        np.testing.assert_array_equal(a, b)
    tiles = [(i, j) for i in range(8) for j in range(i + 1)]  # blocks of 8: some tile takes no pair of a move
    moves = [[bool(where.any()) for where, _, _ in scheme._position_moves(pos[:, 8 * i:8 * i + 8], pos[:, 8 * j:8 * j + 8])]
             for i, j in tiles]
    assert any(not all(m) for m in moves) and any(any(m) for m in moves)


VARIANTS = [dict(llama3_factor=8.0), dict(longrope_short_factor=[1.5] * 4, longrope_long_factor=[2.0] * 4,
                                          longrope_factor=4.0, original_length=8),
            dict(self_extend_window=3, self_extend_group=2),
            dict(dca_chunk_size=4, dca_local_window=1)]  # chunks of 3: intra, successive and inter in 12


@pytest.mark.parametrize("options", VARIANTS, ids=lambda o: ",".join(o))
def test_variant_is_causal_prefix_consistent_and_adds_no_parameters(options):
    lm = model(**options)
    x = tokens(12)
    full = lm(x)
    changed = x.at[:, 6:].set((x[:, 6:] + 5) % CFG.vocab_size)
    np.testing.assert_allclose(lm(changed)[:, :6], full[:, :6], atol=1e-5, rtol=1e-5)
    if "longrope_short_factor" not in options:  # LongRoPE switches factors with the window's length
        np.testing.assert_allclose(lm(x[:, :7]), full[:, :7], atol=1e-5, rtol=1e-5)
    else:
        short = lm(x[:, :8])  # within L_train = 8: the short factors, in the prefix too
        np.testing.assert_allclose(lm(x[:, :5]), short[:, :5], atol=1e-5, rtol=1e-5)
        assert not np.allclose(lm(x[:, :9])[:, :5], short[:, :5], atol=1e-4)  # beyond it: the long ones
    assert not np.allclose(full, model()(x), atol=1e-4)
    shapes = lambda m: jax.tree.map(jnp.shape, nnx.state(m, nnx.Param))
    assert shapes(lm) == shapes(model())


@pytest.mark.parametrize("options, match", [
    (dict(llama3_factor=0.5), "llama3_factor"),
    (dict(llama3_factor=8.0, llama3_low_freq_factor=4.0, llama3_high_freq_factor=4.0), "llama3_high_freq_factor"),
    (dict(llama3_factor=8.0, yarn_scale=4.0), "yarn_scale"),
    (dict(llama3_factor=8.0, longrope_short_factor=[1.0] * 8, longrope_long_factor=[1.0] * 8), "llama3_factor"),
    (dict(longrope_short_factor=[1.0] * 7, longrope_long_factor=[1.0] * 8), "longrope_short_factor"),
    (dict(longrope_short_factor=[1.0] * 8, longrope_long_factor=[1.0] * 4), "longrope_long_factor"),
    (dict(longrope_short_factor=[1.0] * 8), "longrope_long_factor"),
    (dict(longrope_short_factor=[1.0] * 8, longrope_long_factor=[0.0] * 8), "longrope_long_factor"),
    (dict(longrope_short_factor=[1.0] * 8, longrope_long_factor=[1.0] * 8, rerope_window=4), "rerope_window"),
    (dict(longrope_attention_factor=-1.0), "longrope_attention_factor"),
    (dict(longrope_factor=0.0), "longrope_factor"),
    (dict(self_extend_window=-1), "self_extend_window"),
    (dict(self_extend_window=4, self_extend_group=0), "self_extend_group"),
    (dict(self_extend_window=4, rerope_window=4), "rerope_window"),
    (dict(self_extend_window=4, xpos=True), "xpos"),
    (dict(self_extend_window=4, dynamic_ntk=True), "dynamic_ntk"),
    (dict(self_extend_window=4, longrope_short_factor=[1.0] * 8, longrope_long_factor=[1.0] * 8), "LongRoPE"),
    (dict(yarn_dynamic=True, yarn_scale=2.0), "yarn_scale"),
    (dict(yarn_dynamic=True, dynamic_ntk=True), "dynamic_ntk"),
    (dict(yarn_dynamic=True, llama3_factor=2.0), "yarn_dynamic"),
    (dict(yarn_dynamic=True, self_extend_window=4), "yarn_dynamic"),
    (dict(yarn_dynamic=True, dca_chunk_size=4), "yarn_dynamic"),
    (dict(yarn_dynamic=True, rerope_window=4), "yarn_dynamic")])
def test_meaningless_or_undefined_combinations_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        build(**options)


def test_dynamic_yarn_is_static_yarn_at_each_rows_own_scale():
    """Dynamic YaRN (the YaRN paper's training-free form): a row of n keys is rotated as static YaRN
    with s = n / L_train rotates it (its temperature included), plain RoPE within L_train; rows of
    other lengths in one batch each take their own scale."""
    L = TRAIN_LENGTH
    dynamic = build(yarn_dynamic=True)
    q, k = qk(3 * L, 3 * L, batch=2)
    positions = jnp.broadcast_to(jnp.arange(3 * L), (2, 3 * L))
    for n in (L // 2, L, 2 * L + 5, 3 * L):
        static = build(yarn_scale=n / L) if n > L else build()
        expected = static.rotate(q[:, :n], k[:, :n], positions[:, :n], positions[:, :n])
        got = dynamic.rotate(q[:, :n], k[:, :n], positions[:, :n], positions[:, :n])
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-6)
    # per row: a row whose largest position is 2L - 1 (scale 2) beside one at 3L - 1 (scale 3)
    rows = positions.at[0].set(jnp.minimum(positions[0], 2 * L - 1))
    _, k_rows = dynamic.rotate(q, k, rows, rows)
    np.testing.assert_allclose(k_rows[0], build(yarn_scale=2.0).rotate(q, k, rows, rows)[1][0], atol=1e-6)
    np.testing.assert_allclose(k_rows[1], build(yarn_scale=3.0).rotate(q, k, rows, rows)[1][1], atol=1e-6)
