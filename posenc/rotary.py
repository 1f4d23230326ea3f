"""Rotary position embedding: rotate query and key so that their dot product sees only m - n.

`rope` also carries the RoPE extensions that change no parameter, so that a model trained with plain
RoPE can be evaluated with any of them (`--config.posenc.rope.<option>=...`): position
interpolation, NTK-aware and dynamic NTK base scaling, YaRN, ReRoPE and xPos. `xpos` is registered
as well: the same class with xPos switched on by default, as Sun et al. train it.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from posenc.base import ModelDims, Scheme, register


def rope_inverse_frequencies(rotary_dim: int, base: float | jax.Array = 10000.0) -> jax.Array:
    """theta_i = base^(-2i / rotary_dim), i = 0 .. rotary_dim/2 - 1 (Su et al. 2021)."""
    return base ** (-jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)


def apply_rotary(x_BxTxHxK: jax.Array, positions_BxT: jax.Array, inv_freq: jax.Array,
                 scale_BxTxR2: jax.Array | None = None, mscale: float = 1.0) -> jax.Array:
    """Rotate the first 2*R2 features of every head by angle position * theta_i (R2 = inv_freq's
    last axis; `inv_freq` is R2 or, one set per row, B x 1 x R2).

    Pairs are (i, i + R/2) ("rotate half" layout); any fixed pairing gives the same scheme.
    `scale_BxTxR2`, if given, multiplies both features of pair i after the rotation (xPos);
    `mscale` multiplies cos and sin, so the rotated features only (YaRN's attention factor).
    """
    rotary_dim = 2 * inv_freq.shape[-1]
    x_rot, x_pass = x_BxTxHxK[..., :rotary_dim], x_BxTxHxK[..., rotary_dim:]
    angles_BxTxR2 = positions_BxT.astype(jnp.float32)[..., None] * inv_freq
    cos_sin = jnp.concatenate([jnp.cos(angles_BxTxR2), jnp.sin(angles_BxTxR2)], axis=-1)
    cos_sin = _materialized(cos_sin if mscale == 1.0 else cos_sin * mscale)
    cos, sin = (c[:, :, None, :] for c in jnp.split(cos_sin, 2, axis=-1))
    x1, x2 = jnp.split(x_rot.astype(jnp.float32), 2, axis=-1)
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if scale_BxTxR2 is not None:
        scale = scale_BxTxR2[:, :, None, :]
        y1, y2 = y1 * scale, y2 * scale
    rotated = jnp.concatenate([y1, y2], axis=-1)
    return jnp.concatenate([rotated.astype(x_BxTxHxK.dtype), x_pass], axis=-1)


def _materialized(x_BxTxN: jax.Array) -> jax.Array:
    """`x` itself, through a product with the identity matrix (exact in float32 at HIGHEST precision).
    XLA does not fuse a matrix product into the elementwise loops that read it, so the sin and cos
    above are computed once per (position, frequency) instead of again inside every B x T x H x K
    loop of the rotation and of its gradient. That made a rope training step of the benchmark model
    7-8% faster on 2 CPU cores (benchmarks/README.md)."""
    eye = jnp.eye(x_BxTxN.shape[-1], dtype=x_BxTxN.dtype)
    return jnp.einsum("btr,rs->bts", x_BxTxN, eye, precision=jax.lax.Precision.HIGHEST)


@dataclasses.dataclass(frozen=True)
class RopeOptions:
    base: float = 10000.0
    fraction: float = 1.0         # share of each head's features that are rotated (partial rotary)
    # Evaluation-time extensions (no parameters); the defaults below are plain RoPE.
    pi_factor: float = 1.0        # position interpolation: positions x pi_factor (= L_train / L_target)
    ntk_alpha: float = 1.0        # NTK-aware scaling: base' = base * alpha^(d / (d - 2))
    dynamic_ntk: bool = False     # alpha = max(1, f (largest key position + 1) / L_train - (f - 1)), per row
    dynamic_ntk_factor: float = 1.0  # f, HF's rope_scaling "factor" for "dynamic" (published: 2 or more)
    yarn_scale: float = 1.0       # YaRN's s = L_target / L_train (1 = off)
    yarn_beta_fast: float = 32.0  # beta: frequencies with more than beta turns in L_train are kept
    yarn_beta_slow: float = 1.0   # alpha: frequencies with fewer than alpha turns are interpolated
    yarn_temperature: bool = True # rotated features x (0.1 ln s + 1) in q and k; False = "NTK-by-parts"
    yarn_ramp: str = "index"      # "index": the authors' code (linear in the feature index between
                                  # whole correction dimensions); "turns": the paper's equation (linear in r)
    original_length: int = 0      # L_train that YaRN and dynamic NTK scale from (HF's
                                  # original_max_position_embeddings); 0 = this run's training length.
                                  # A run extended from a shorter one (train.init_from) sets the base's.
    rerope_window: int = 0        # ReRoPE: relative positions beyond w count as w (0 = off)
    xpos: bool = False            # xPos: q x zeta^(m/gamma), k x zeta^(-n/gamma)
    xpos_gamma0: float = 0.4      # zeta_i = (2i/d + gamma0) / (1 + gamma0)
    xpos_scale_base: float = 512.0  # gamma


YARN_RAMPS = ("index", "turns")


def validate_rope_options(options: RopeOptions) -> None:
    """Refuse values that have no meaning (ValueError naming the option)."""
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
    if options.rerope_window and options.dynamic_ntk:
        raise ValueError("rope.rerope_window cannot be combined with rope.dynamic_ntk (the bias of a "
                         "tile cannot know the alpha of the whole window)")
    if options.xpos_scale_base <= 0 or options.xpos_gamma0 <= 0:
        raise ValueError("rope.xpos_scale_base and rope.xpos_gamma0 must be positive")


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
      YaRN (s = yarn_scale): theta_i <- (1 - gamma_i) theta_i / s + gamma_i theta_i, computed as
              theta_i / s + gamma_i theta_i (1 - 1/s) so that s = 1 is exactly theta_i; gamma_i
              from `yarn_index_ramp` (yarn_ramp="index", the default) or `yarn_ramp` ("turns");
      PI: theta_i <- pi_factor * theta_i (the same as multiplying every position by pi_factor).
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
    inv_freq = rope_inverse_frequencies(rotary_dim, base)
    # Applied unconditionally: s = 1 and pi_factor = 1 leave theta unchanged bit for bit.
    s = options.yarn_scale
    if options.yarn_ramp == "index":
        gamma = yarn_index_ramp(rotary_dim, options.base, train_length, options.yarn_beta_slow,
                                options.yarn_beta_fast)
    else:
        gamma = yarn_ramp(inv_freq, train_length, options.yarn_beta_slow, options.yarn_beta_fast)
    inv_freq = inv_freq / s + gamma * inv_freq * (1.0 - 1.0 / s)
    return inv_freq * options.pi_factor


def yarn_mscale(options: RopeOptions) -> float:
    """YaRN's attention factor sqrt(1/t) = 0.1 ln(s) + 1 (1 when off). Like the authors' code, it
    multiplies cos and sin, so the rotated features of q and k: the rotated part of every logit is
    scaled by 1/t, and with partial rotary the unrotated part is not."""
    if options.yarn_scale == 1.0 or not options.yarn_temperature:
        return 1.0
    return 0.1 * math.log(options.yarn_scale) + 1.0


def xpos_zeta(rotary_dim: int, gamma0: float = 0.4) -> jax.Array:
    """zeta_i = (2i/d + gamma0) / (1 + gamma0), i = 0 .. d/2 - 1 (Sun et al. 2022), d = rotary_dim."""
    i = jnp.arange(rotary_dim // 2, dtype=jnp.float32)
    return (2.0 * i / rotary_dim + gamma0) / (1.0 + gamma0)


def xpos_scales(positions_BxT: jax.Array, center_B: jax.Array, zeta: jax.Array, scale_base: float,
                sign: float) -> jax.Array:
    """zeta^(sign * (p - c) / gamma), B x T x R/2. Queries use sign +1, keys -1; the centre c (the
    same for queries and keys) cancels in every score and only keeps the powers in float range."""
    exponent_BxT = sign * (positions_BxT.astype(jnp.float32) - center_B[:, None]) / scale_base
    return zeta ** exponent_BxT[..., None]


@register("rope")
class Rope(Scheme):
    """Rotary position embedding (RoFormer), with evaluation-time extensions as options.

    q_m <- R(m theta) q_m, k_n <- R(n theta) k_n, with 2x2 rotations of feature pairs at angles
    m * theta_i, theta_i = base^(-2i/d); then <R(m theta) q, R(n theta) k> = <q, R((n - m) theta) k>.
    Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.

    Options (all off by default; none adds a parameter, so each can be switched on at evaluation):
    - fraction: partial rotary, only the first floor(fraction * d) (even) features rotate.
    - pi_factor: position interpolation, theta_i <- pi_factor * theta_i, pi_factor = L_train /
      L_target (Chen et al. 2023, "Extending Context Window of Large Language Models via
      Positional Interpolation").
    - ntk_alpha: NTK-aware scaling, base <- base * alpha^(d/(d-2)) (bloc97 2023, Reddit
      "NTK-Aware Scaled RoPE"; formalised by Peng et al. 2023).
    - dynamic_ntk, dynamic_ntk_factor (f): the same with alpha = max(1, f (n_max + 1) / L_train -
      (f - 1)), n_max the largest key position of the row (emozilla 2023, "Dynamically Scaled
      RoPE"; the formula of HF transformers' _compute_dynamic_ntk_parameters, whose "factor" is f:
      f = 1, the default, is alpha = length / L_train). This alpha depends on the
      window, not only on the pair: within L_train it is plain RoPE; beyond it every position of
      the window is encoded with the window's alpha, so a prefix longer than L_train is encoded
      differently inside a longer window (by design of the method). It relies on `rotate` seeing
      all keys of the window at once, as dense and blockwise attention both call it.
    - yarn_scale (s), yarn_beta_fast (beta), yarn_beta_slow (alpha), yarn_temperature: YaRN (Peng
      et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models"):
      r_i = L_train / lambda_i, lambda_i = 2 pi / theta_i; gamma(r) = 0 if r < alpha, 1 if
      r > beta, (r - alpha)/(beta - alpha) otherwise; theta_i <- (1 - gamma) theta_i / s +
      gamma theta_i. The default ramp (yarn_ramp="index") is the authors' code's, which every
      published YaRN result used (jquesnelle/yarn; HF transformers' _compute_yarn_parameters):
      linear in the feature index i between the indices where theta_i makes beta and alpha turns
      over L_train, rounded down and up to whole indices; yarn_ramp="turns" is the equation
      above, linear in r (the inverse frequencies differ by up to 80%: rotary dim 32, L = 64,
      s = 16). Temperature: cos and sin are multiplied by sqrt(1/t) = 0.1 ln(s) + 1, as in the
      authors' code, so the rotated part of each logit is multiplied by 1/t (all of it without
      partial rotary: the paper's softmax(q^T k / (t sqrt(d)))).
    - rerope_window (w): ReRoPE (Su 2023, "Transformer升级之路 12: 无限外推的ReRoPE?",
      kexue.fm/archives/9708): the relative position m - n is replaced by min(m - n, w). Realised
      exactly (up to float rounding) through the `bias` hook, which receives the rotated q and k:
      for pairs with m - n > w it adds  scale * (<R(w - m) q'_m, R(-n) k'_n> - <q'_m, k'_n>) / sqrt(K)
      (q', k' rotated at m and n), i.e. it replaces the RoPE logit by <R(w) q_m, k_n> / sqrt(K),
      the logit at relative position w. Keys after the query (masked in a decoder) are left alone.
      Costs two extra q k^T products per layer, as Su's own two-pass implementation. Not combinable
      with xpos (its decay would not be clamped) nor with dynamic_ntk (a tile cannot know alpha).
    - xpos, xpos_gamma0, xpos_scale_base: xPos (Sun et al. 2022, "A Length-Extrapolatable
      Transformer"): after the rotation q_m <- q_m * zeta^(m/gamma), k_n <- k_n * zeta^(-n/gamma)
      per feature pair, zeta_i = (2i/d + gamma0)/(1 + gamma0), gamma = xpos_scale_base, so that
      pair i of every score decays by zeta_i^((m - n)/gamma). Positions are centred per call
      (the same centre for q and k, which cancels) to keep the powers in float32 range. The
      paper's blockwise causal attention at inference is not part of the encoding.
    """
    family = "relative"
    citation = "Su et al. 2021"
    extrapolates = "with option"  # plain RoPE degrades; PI / NTK / YaRN / ReRoPE at evaluation
    Options = RopeOptions

    def __init__(self, options, dims: ModelDims, *, rngs):
        super().__init__(options, dims, rngs=rngs)
        validate_rope_options(options)
        self.rotary_dim = rotary_dim_of(options, dims.head_dim)
        uses_ntk = options.dynamic_ntk or options.ntk_alpha != 1.0
        if uses_ntk and 0 < self.rotary_dim <= 2:
            raise ValueError(f"NTK scaling needs more than 2 rotated features per head, got "
                             f"{self.rotary_dim}; raise rope.fraction")

    def _inv_freq(self, k_pos_BxS: jax.Array) -> jax.Array:
        """R/2, or B x 1 x R/2 with dynamic NTK (one alpha per row)."""
        length_B = jnp.max(k_pos_BxS, axis=-1) + 1 if self.options.dynamic_ntk else None
        inv_freq = scaled_inverse_frequencies(self.options, self.rotary_dim,
                                              self.options.original_length or self.dims.train_length, length_B)
        return inv_freq[:, None, :] if inv_freq.ndim == 2 else inv_freq

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        if self.rotary_dim == 0:
            return q_BxTxHxK, k_BxSxHxK
        inv_freq = self._inv_freq(k_pos_BxS)
        q_scale = k_scale = None
        if self.options.xpos:
            zeta = xpos_zeta(self.rotary_dim, self.options.xpos_gamma0)
            lo = jnp.minimum(q_pos_BxT.min(axis=-1), k_pos_BxS.min(axis=-1))
            hi = jnp.maximum(q_pos_BxT.max(axis=-1), k_pos_BxS.max(axis=-1))
            center_B = (lo + hi).astype(jnp.float32) / 2
            q_scale = xpos_scales(q_pos_BxT, center_B, zeta, self.options.xpos_scale_base, 1.0)
            k_scale = xpos_scales(k_pos_BxS, center_B, zeta, self.options.xpos_scale_base, -1.0)
        mscale = yarn_mscale(self.options)
        return (apply_rotary(q_BxTxHxK, q_pos_BxT, inv_freq, q_scale, mscale),
                apply_rotary(k_BxSxHxK, k_pos_BxS, inv_freq, k_scale, mscale))

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        """ReRoPE's correction (see the class docstring); None when rerope_window is 0."""
        window = self.options.rerope_window
        if window == 0 or self.rotary_dim == 0:
            return None
        inv_freq = self._inv_freq(k_pos_BxS)
        # q, k arrive rotated at m and n: R(w - m) R(m) q = R(w) q and R(-n) R(n) k = k. YaRN's
        # factor, applied by `rotate`, is in both products already.
        q_far = apply_rotary(q_BxTxHxK, window - q_pos_BxT, inv_freq)
        k_far = apply_rotary(k_BxSxHxK, -k_pos_BxS, inv_freq)
        near_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK,
                                  preferred_element_type=jnp.float32)
        far_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_far, k_far, preferred_element_type=jnp.float32)
        scale = q_BxTxHxK.shape[-1] ** -0.5
        distance_Bx1xTxS = (q_pos_BxT[:, :, None] - k_pos_BxS[:, None, :])[:, None]
        return jnp.where(distance_Bx1xTxS > window, (far_BxHxTxS - near_BxHxTxS) * scale, 0.0)


@dataclasses.dataclass(frozen=True)
class XposOptions(RopeOptions):
    xpos: bool = True


@register("xpos")
class Xpos(Rope):
    """xPos: RoPE whose feature pair i decays as zeta_i^((m - n)/gamma) with the distance.

    q_m <- R(m theta) q_m * zeta^(m/gamma), k_n <- R(n theta) k_n * zeta^(-n/gamma),
    zeta_i = (2i/d + gamma0)/(1 + gamma0), gamma0 = 0.4, gamma = scale_base = 512; so the score of
    pair i is zeta_i^((m - n)/gamma) times its RoPE score. Every `rope` option applies as well.
    Sun et al., "A Length-Extrapolatable Transformer", ACL 2023 (arXiv 2022).
    """
    citation = "Sun et al. 2022"
    extrapolates = "partly"
    Options = XposOptions
