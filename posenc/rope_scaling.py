"""RoPE's frequency scalings and their options: position interpolation, NTK-aware and dynamic NTK
base scaling, YaRN, Llama 3 scaling and LongRoPE (the inverse frequencies and attention factors of
each, as their authors' code and HF transformers compute them), p-RoPE's dropped frequencies, and
the options of ReRoPE, Self-Extend, Dual Chunk Attention and xPos, checked (the options dataclass
itself is in posenc/options/rotary.py, free of JAX). The scheme that uses them is `rope` (posenc/rotary.py).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc.options.rotary import YARN_RAMPS, RopeOptions, longrope_on  # noqa: F401  (RopeOptions: re-exported)


def rope_powers(rotary_dim: int, base: float | jax.Array = 10000.0) -> jax.Array:
    """base^(2i / rotary_dim), i = 0 .. rotary_dim/2 - 1, float32, as HF transformers computes them:
    for a base known before tracing, on the host, the float64 power rounded to float32 (torch's float32
    power is correctly rounded, numpy's is not: 13 of 64 entries differ by an ulp at rotary dim 128,
    base 500000, Llama 3's); a traced base (dynamic NTK) behind a barrier that keeps XLA from rewriting
    1 / b^x as b^-x under jit, so that compiled and eager frequencies agree (to within an ulp of torch's)."""
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
    if isinstance(base, (int, float)):
        return jnp.asarray((np.float64(base) ** exponents.astype(np.float64)).astype(np.float32))
    return jax.lax.optimization_barrier(base ** jnp.asarray(exponents))


def rope_inverse_frequencies(rotary_dim: int, base: float | jax.Array = 10000.0) -> jax.Array:
    """theta_i = base^(-2i / rotary_dim), i = 0 .. rotary_dim/2 - 1 (Su et al. 2021), computed as
    1 / base^(2i / rotary_dim) in float32 as HF transformers does (`rope_powers`): the angles of late
    positions then agree, which Hugging Face checkpoints' logits need (tests/models/test_hf.py)."""
    return 1.0 / rope_powers(rotary_dim, base)


def validate_rope_options(options: RopeOptions, rotary_dim: int | None = None) -> None:
    """Refuse values that have no meaning (ValueError naming the option). With `rotary_dim` (R), also
    the lengths of LongRoPE's factor lists (R/2 each)."""
    if not 0.0 <= options.fraction <= 1.0:
        raise ValueError(f"rope.fraction must lie in [0, 1], got {options.fraction}")
    if options.pi_factor <= 0:
        raise ValueError(f"rope.pi_factor must be positive (L_train / L_target), got {options.pi_factor}")
    if options.original_length < 0:
        raise ValueError(f"rope.original_length must be >= 0 (0 = the training length), got {options.original_length}")
    if options.ntk_alpha <= 0:
        raise ValueError(f"rope.ntk_alpha must be positive, got {options.ntk_alpha}")
    if options.dynamic_ntk_factor < 1.0:
        raise ValueError(f"rope.dynamic_ntk_factor must be >= 1, got {options.dynamic_ntk_factor}")
    if options.dynamic_ntk and options.ntk_alpha != 1.0:
        raise ValueError("rope.dynamic_ntk computes alpha from the positions; leave rope.ntk_alpha=1")
    if options.yarn_scale < 1.0:
        raise ValueError(f"rope.yarn_scale is L_target / L_train >= 1, got {options.yarn_scale}")
    if not 0 < options.yarn_beta_slow < options.yarn_beta_fast:
        raise ValueError(f"YaRN needs 0 < rope.yarn_beta_slow < rope.yarn_beta_fast, got "
                         f"{options.yarn_beta_slow} and {options.yarn_beta_fast}")
    if options.yarn_ramp not in YARN_RAMPS:
        raise ValueError(f"unknown rope.yarn_ramp {options.yarn_ramp!r}; valid: {', '.join(YARN_RAMPS)}")
    if options.rerope_window < 0:
        raise ValueError(f"rope.rerope_window must be >= 0 (0 = off), got {options.rerope_window}")
    if options.rerope_window and options.xpos:
        raise ValueError("rope.rerope_window cannot be combined with rope.xpos (the xPos decay "
                         "would not be clamped with the relative position)")
    if options.rerope_window and options.yarn_dynamic:
        raise ValueError("rope.rerope_window cannot be combined with rope.yarn_dynamic (the bias of a tile "
                         "cannot know its row's scale)")
    if options.rerope_window and options.dynamic_ntk:
        raise ValueError("rope.rerope_window cannot be combined with rope.dynamic_ntk (the bias of a "
                         "tile cannot know the alpha of the whole window)")
    if options.xpos_scale_base <= 0 or options.xpos_gamma0 <= 0:
        raise ValueError("rope.xpos_scale_base and rope.xpos_gamma0 must be positive")
    if not 0.0 <= options.p_rope <= 1.0:
        raise ValueError(f"rope.p_rope is the share of frequency pairs that rotate, in [0, 1] (e.g. 0.75; "
                         f"1 = plain RoPE, 0 = none), got {options.p_rope}")
    _validate_llama3_longrope(options, rotary_dim)
    _validate_self_extend(options)
    _validate_dual_chunk(options)


def _validate_llama3_longrope(options: RopeOptions, rotary_dim: int | None) -> None:
    if options.llama3_factor < 1.0:
        raise ValueError(f"rope.llama3_factor is L_target / L_train >= 1 (1 = off), got {options.llama3_factor}")
    if not 0 < options.llama3_low_freq_factor < options.llama3_high_freq_factor:
        raise ValueError(f"Llama 3 scaling needs 0 < rope.llama3_low_freq_factor < rope.llama3_high_freq_factor, "
                         f"got {options.llama3_low_freq_factor} and {options.llama3_high_freq_factor}")
    longrope = longrope_on(options)
    if options.yarn_dynamic and options.yarn_scale != 1.0:
        raise ValueError(f"rope.yarn_dynamic sets YaRN's scale from the length; leave rope.yarn_scale=1 (got "
                         f"{options.yarn_scale})")
    if options.yarn_dynamic and options.dynamic_ntk:
        raise ValueError("rope.yarn_dynamic and rope.dynamic_ntk each scale with the length; set one of them")
    recipes = [name for name, on in (("rope.yarn_scale / yarn_dynamic", options.yarn_scale != 1.0 or options.yarn_dynamic),
                                     ("rope.llama3_factor", options.llama3_factor != 1.0),
                                     ("rope.longrope_short_factor/long_factor", longrope)) if on]
    if len(recipes) > 1:
        raise ValueError(f"{' and '.join(recipes)} are each a whole frequency recipe (HF's rope types yarn, "
                         f"llama3, longrope); set one of them")
    if options.longrope_factor <= 0:
        raise ValueError(f"rope.longrope_factor must be positive (L_target / L_train), got {options.longrope_factor}")
    if options.longrope_attention_factor < 0:
        raise ValueError(f"rope.longrope_attention_factor must be >= 0 (0 = HF's default), got "
                         f"{options.longrope_attention_factor}")
    if not longrope:
        return
    for name in ("longrope_short_factor", "longrope_long_factor"):
        factors = getattr(options, name)
        if not factors:
            raise ValueError(f"LongRoPE needs both factor lists: rope.{name} is empty")
        if any(not isinstance(f, (int, float)) or isinstance(f, bool) or not f > 0 for f in factors):
            raise ValueError(f"rope.{name} must hold positive numbers, got {tuple(factors)}")
        if rotary_dim is not None and len(factors) != rotary_dim // 2:
            raise ValueError(f"rope.{name} needs one factor per rotated feature pair: {rotary_dim // 2} "
                             f"(R/2, R = {rotary_dim} rotated features), got {len(factors)}")
    if options.rerope_window:
        raise ValueError("rope.rerope_window cannot be combined with LongRoPE (rope.longrope_short_factor/"
                         "long_factor): the bias of a tile cannot know which factors its row uses")


def _validate_self_extend(options: RopeOptions) -> None:
    if options.self_extend_window < 0:
        raise ValueError(f"rope.self_extend_window must be >= 0 (0 = off), got {options.self_extend_window}")
    if options.self_extend_group < 1:
        raise ValueError(f"rope.self_extend_group must be >= 1, got {options.self_extend_group}")
    if not options.self_extend_window:
        return
    clashes = [("rope.rerope_window", options.rerope_window != 0, "both replace the far logits"),
               ("rope.xpos", options.xpos, "its decay would stay at the true distance"),
               ("rope.dynamic_ntk", options.dynamic_ntk, "the bias of a tile cannot know alpha"),
               ("rope.yarn_dynamic", options.yarn_dynamic, "the bias of a tile cannot know its row's scale"),
               ("LongRoPE (rope.longrope_short_factor/long_factor)", longrope_on(options),
                "the bias of a tile cannot know which factors its row uses")]
    for name, on, why in clashes:
        if on:
            raise ValueError(f"rope.self_extend_window cannot be combined with {name} ({why})")


def _validate_dual_chunk(options: RopeOptions) -> None:
    size, window = options.dca_chunk_size, options.dca_local_window
    if not size:
        return
    if not 0 <= window < size:
        raise ValueError(f"rope.dca_local_window must lie in [0, rope.dca_chunk_size) = [0, {size}), got {window}")
    clashes = [("rope.rerope_window", options.rerope_window != 0), ("rope.self_extend_window",
               options.self_extend_window != 0), ("rope.xpos", options.xpos), ("rope.dynamic_ntk", options.dynamic_ntk),
               ("rope.yarn_dynamic", options.yarn_dynamic),
               ("LongRoPE (rope.longrope_short_factor/long_factor)", longrope_on(options))]
    for name, on in clashes:
        if on:
            raise ValueError(f"rope.dca_chunk_size cannot be combined with {name} (each replaces the far "
                             f"logits, or the bias of a tile cannot know its row's frequencies)")


def rotary_dim_of(options: RopeOptions, head_dim: int) -> int:
    """How many features of each head are rotated: floor(head_dim * fraction) rounded down to even."""
    return int(head_dim * options.fraction) // 2 * 2


def ntk_base(base: float | jax.Array, alpha: float | jax.Array, rotary_dim: int):
    """NTK-aware base (bloc97 2023): base * alpha^(d / (d - 2)), d = rotary_dim."""
    if rotary_dim <= 2:
        raise ValueError(f"NTK scaling needs more than 2 rotated features, got {rotary_dim}")
    return base * alpha ** (rotary_dim / (rotary_dim - 2))


def yarn_ramp(inv_freq: jax.Array, train_length: int, beta_slow: float, beta_fast: float) -> jax.Array:
    """gamma(r) of the YaRN paper's equation (Peng et al. 2023), r = L_train / lambda = L_train *
    theta / (2 pi) turns: 0 below beta_slow (interpolate), 1 above beta_fast (keep), linear in r."""
    turns = train_length * inv_freq / (2 * math.pi)
    return jnp.clip((turns - beta_slow) / (beta_fast - beta_slow), 0.0, 1.0)


def yarn_correction_index(turns: float, rotary_dim: int, base: float, train_length: int) -> float:
    """The (fractional) feature-pair index i at which theta_i = base^(-2i/d) makes `turns` turns
    over L_train: L_train theta_i / (2 pi) = turns, i.e. i = d ln(L_train / (2 pi turns)) / (2 ln base)."""
    return rotary_dim * math.log(train_length / (2 * math.pi * turns)) / (2 * math.log(base))


def yarn_index_ramp(rotary_dim: int, base: float, train_length: int, beta_slow: float,
                    beta_fast: float) -> jax.Array:
    """gamma_i of the authors' code (jquesnelle/yarn; HF transformers' _compute_yarn_parameters):
    1 (keep) up to the pair index where theta makes beta_fast turns, rounded down, 0 (interpolate)
    from the index where it makes beta_slow turns, rounded up, linear in the index between them.
    The ends are clipped to [0, d - 1] (d, not d/2, as the reference does)."""
    low = max(math.floor(yarn_correction_index(beta_fast, rotary_dim, base, train_length)), 0)
    high = min(math.ceil(yarn_correction_index(beta_slow, rotary_dim, base, train_length)), rotary_dim - 1)
    if high == low:
        high += 0.001  # the reference's guard against a zero-width ramp
    i = jnp.arange(rotary_dim // 2, dtype=jnp.float32)
    return 1.0 - jnp.clip((i - low) / (high - low), 0.0, 1.0)


def scaled_inverse_frequencies(options: RopeOptions, rotary_dim: int, train_length: int,
                               length: jax.Array | int | None = None) -> jax.Array:
    """The inverse frequencies RoPE uses under `options`, R/2 (or B x R/2 for a per-row `length`).

    In this order (the papers use one at a time; combinations compose):
      base' = base * alpha^(d/(d-2)), alpha = ntk_alpha, or max(1, f length / L_train - (f - 1))
              with dynamic_ntk (`length` = largest key position + 1, required then; f =
              dynamic_ntk_factor);
      theta_i = base'^(-2i/d);
      LongRoPE: theta_i <- theta_i / f_i, f = longrope_long_factor where `length` > L_train, else
              longrope_short_factor (per row; without `length`, the short factors, as HF at init);
      Llama 3 (llama3_factor != 1): `llama3_inverse_frequencies`;
      YaRN (s = yarn_scale): theta_i <- (1 - gamma_i) theta_i / s + gamma_i theta_i, computed as
              theta_i / s + gamma_i theta_i (1 - 1/s) so that s = 1 is exactly theta_i; gamma_i
              from `yarn_index_ramp` (yarn_ramp="index", the default) or `yarn_ramp` ("turns");
              with yarn_dynamic, s = max(1, length / L_train) per row (`dynamic_yarn_scale`);
      PI: theta_i <- pi_factor * theta_i (the same as multiplying every position by pi_factor);
      p-RoPE (p_rope != 1): theta_i <- 0 for the pairs past `p_rope_pairs` (the lowest frequencies).
    """
    base = options.base
    if options.dynamic_ntk:
        if length is None:
            raise ValueError("dynamic NTK needs `length` (largest key position + 1)")
        f = options.dynamic_ntk_factor
        alpha = jnp.maximum(1.0, f * jnp.asarray(length, jnp.float32) / train_length - (f - 1.0))
        base = ntk_base(base, alpha, rotary_dim)[..., None]
    elif options.ntk_alpha != 1.0:
        base = ntk_base(base, options.ntk_alpha, rotary_dim)
    if longrope_on(options):  # 1 / (f_i base^(2i/d)), in HF's order
        inv_freq = _reciprocal(longrope_factors(options, train_length, length) * rope_powers(rotary_dim, base))
    else:
        inv_freq = rope_inverse_frequencies(rotary_dim, base)
    if options.llama3_factor != 1.0:  # (factor 1 would still round the band between the wavelengths)
        inv_freq = llama3_inverse_frequencies(inv_freq, options.llama3_factor, options.llama3_low_freq_factor,
                                              options.llama3_high_freq_factor, train_length)
    # Applied unconditionally: s = 1 and pi_factor = 1 leave theta unchanged bit for bit.
    s = options.yarn_scale
    if options.yarn_dynamic:  # s per row, from the row's length (B x 1, broadcast over the pairs)
        s = dynamic_yarn_scale(train_length, length)[..., None]
    if options.yarn_ramp == "index":
        gamma = yarn_index_ramp(rotary_dim, options.base, train_length, options.yarn_beta_slow,
                                options.yarn_beta_fast)
    else:
        gamma = yarn_ramp(inv_freq, train_length, options.yarn_beta_slow, options.yarn_beta_fast)
    inv_freq = inv_freq / s + gamma * inv_freq * (1.0 - 1.0 / s)
    inv_freq = inv_freq * options.pi_factor
    if options.p_rope != 1.0:
        inv_freq = jnp.where(jnp.arange(rotary_dim // 2) < p_rope_pairs(options.p_rope, rotary_dim), inv_freq, 0.0)
    return inv_freq


def p_rope_pairs(p: float, rotary_dim: int) -> int:
    """How many feature pairs p-RoPE keeps rotating, the first (highest-frequency) ones: int(p R // 2)
    for R rotated features, as google-deepmind/gemma's `apply_rope` computes its `rope_angles` from
    `rope_proportion` (gemma/gm/math/_positional_embeddings.py; Barbero et al. 2025)."""
    return int(p * rotary_dim // 2)


def llama3_inverse_frequencies(inv_freq: jax.Array, factor: float, low_freq_factor: float,
                               high_freq_factor: float, original_length: int) -> jax.Array:
    """Llama 3.1's frequency scaling (Meta's llama-models `apply_scaling`; HF transformers'
    `_compute_llama3_parameters`), in the reference's float32 operations and order: with wavelength
    lambda_i = 2 pi / theta_i, theta_i / factor where lambda_i > L / low_freq_factor, theta_i where
    lambda_i < L / high_freq_factor, and between them (1 - s) theta_i / factor + s theta_i with
    s = (L / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor), L = original_length.
    torch evaluates a number divided by a tensor (2 pi / theta, L / lambda) as the tensor's reciprocal
    times the number, which rounds otherwise than a division (1 ulp in some frequencies, e.g. rotary
    dim 32 at factor 16): so here, each step behind a barrier that keeps XLA from folding it back."""
    low_freq_wavelen = original_length / low_freq_factor
    high_freq_wavelen = original_length / high_freq_factor
    wavelen = jax.lax.optimization_barrier(_reciprocal(inv_freq) * np.float32(2 * math.pi))
    scaled = jnp.where(wavelen > low_freq_wavelen, _divided(inv_freq, factor), inv_freq)
    per_wavelength = jax.lax.optimization_barrier(_reciprocal(wavelen) * np.float32(original_length))
    smooth = _divided(per_wavelength - low_freq_factor, high_freq_factor - low_freq_factor)
    smoothed = _divided((1 - smooth) * scaled, factor) + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return jnp.where(medium, smoothed, scaled)


def _reciprocal(x: jax.Array) -> jax.Array:
    """1 / x, correctly rounded, kept from being fused with what follows (an optimization barrier)."""
    return jax.lax.optimization_barrier(1.0 / x)


def _divided(x: jax.Array, divisor: float) -> jax.Array:
    """x / divisor, correctly rounded as torch divides: XLA turns a division by a broadcast scalar
    into a product with its reciprocal (1 ulp off for a divisor such as 3), unless the divisor is
    an array it cannot see through (an optimization barrier). Costs nothing at R/2 elements."""
    return x / jax.lax.optimization_barrier(jnp.full(jnp.shape(x), divisor, jnp.float32))


def longrope_factors(options: RopeOptions, train_length: int, length: jax.Array | int | None = None) -> jax.Array:
    """LongRoPE's rescale factors, R/2 (or B x R/2 for a per-row `length`): the long ones where
    `length` (largest key position + 1) > L_train, else the short ones (HF transformers'
    `longrope_frequency_update`, which decides once per batch from the largest position)."""
    short = jnp.asarray(options.longrope_short_factor, jnp.float32)
    long = jnp.asarray(options.longrope_long_factor, jnp.float32)
    if length is None:
        return short
    beyond = jnp.asarray(length) > train_length
    return jnp.where(beyond[..., None], long, short) if jnp.ndim(beyond) else jnp.where(beyond, long, short)


def longrope_mscale(options: RopeOptions, train_length: int) -> float:
    """LongRoPE's attention factor (1 when off): `longrope_attention_factor`, or where that is 0 HF's
    default (`_compute_longrope_parameters`; Phi-3's LongRoPE rotary embedding): sqrt(1 + ln f /
    ln L_train) for f = longrope_factor > 1, else 1. It multiplies cos and sin in every row, short
    or long, as in the reference."""
    if not longrope_on(options):
        return 1.0
    if options.longrope_attention_factor:
        return float(options.longrope_attention_factor)
    factor = options.longrope_factor
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(train_length))


def rope_mscale(options: RopeOptions, train_length: int, length: jax.Array | None = None) -> float | jax.Array:
    """What cos and sin are multiplied by: YaRN's and LongRoPE's attention factors (at most one is
    on); one per row (B) for dynamic YaRN, whose scale follows `length` (required then)."""
    if options.yarn_dynamic:
        if length is None:
            raise ValueError("dynamic YaRN needs `length` (largest key position + 1)")
        s = dynamic_yarn_scale(train_length, length)
        return 0.1 * jnp.log(s) + 1.0 if options.yarn_temperature else jnp.ones_like(s)
    return yarn_mscale(options) * longrope_mscale(options, train_length)


def yarn_mscale(options: RopeOptions) -> float:
    """YaRN's attention factor sqrt(1/t) = 0.1 ln(s) + 1 (1 when off). Like the authors' code, it
    multiplies cos and sin, so the rotated features of q and k: the rotated part of every logit is
    scaled by 1/t, and with partial rotary the unrotated part is not."""
    if options.yarn_scale == 1.0 or not options.yarn_temperature:
        return 1.0
    return 0.1 * math.log(options.yarn_scale) + 1.0


def dynamic_yarn_scale(train_length: int, length: jax.Array | int | None) -> jax.Array:
    """Dynamic YaRN's scale s = max(1, length / L_train) (`length`: the row's largest key position + 1;
    B or a scalar): the YaRN paper's training-free form (Peng et al. 2024, section 3.3; the authors'
    LlamaDynamicYaRNScaledRotaryEmbedding recomputes YaRN with s = sequence length / original length
    once the sequence outgrows the window, plain RoPE before)."""
    if length is None:
        raise ValueError("dynamic YaRN needs `length` (largest key position + 1)")
    return jnp.maximum(1.0, jnp.asarray(length, jnp.float32) / train_length)
