"""Rotary position embedding: rotate query and key so that their dot product sees only m - n.

`rope` also carries the RoPE extensions that change no parameter, so that a model trained with plain
RoPE can be evaluated with any of them (`--config.posenc.rope.<option>=...`): position
interpolation, NTK-aware and dynamic NTK base scaling, YaRN, Llama 3 scaling, LongRoPE, ReRoPE,
Self-Extend, Dual Chunk Attention and xPos. `xpos` is registered as well: the same class with xPos switched on by default,
as Sun et al. train it.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from posenc.base import ModelDims, Scheme
from posenc.options.rotary import RopeOptions, XposOptions, longrope_on, rope_bias_on
from posenc.registry import register
from posenc.rope_scaling import (rope_mscale, rotary_dim_of, scaled_inverse_frequencies,
                                 validate_rope_options)


def apply_rotary(x_BxTxHxK: jax.Array, positions_BxT: jax.Array, inv_freq: jax.Array,
                 scale_BxTxR2: jax.Array | None = None, mscale: float = 1.0) -> jax.Array:
    """Rotate the first 2*R2 features of every head by angle position * theta_i (R2 = inv_freq's
    last axis; `inv_freq` is R2 or, one set per row, B x 1 x R2).

    Pairs are (i, i + R/2) ("rotate half" layout); any fixed pairing gives the same scheme.
    `scale_BxTxR2`, if given, multiplies both features of pair i after the rotation (xPos);
    `mscale` multiplies cos and sin, so the rotated features only (YaRN's attention factor; a float,
    or one per row, B, for dynamic YaRN).
    """
    rotary_dim = 2 * inv_freq.shape[-1]
    x_rot, x_pass = x_BxTxHxK[..., :rotary_dim], x_BxTxHxK[..., rotary_dim:]
    angles_BxTxR2 = positions_BxT.astype(jnp.float32)[..., None] * inv_freq
    cos_sin = jnp.concatenate([jnp.cos(angles_BxTxR2), jnp.sin(angles_BxTxR2)], axis=-1)
    if not isinstance(mscale, (int, float)):  # one factor per row (dynamic YaRN)
        cos_sin = cos_sin * jnp.reshape(mscale, (-1, 1, 1))
    elif mscale != 1.0:
        cos_sin = cos_sin * mscale
    cos_sin = _materialized(cos_sin)
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
    - p_rope (p): p-RoPE (Barbero, Vitvitskyi, Perivolaropoulos, Pascanu & Veličković, "Round and
      Round We Go! What makes Rotary Positional Encodings useful?", ICLR 2025): only the first
      int(p R // 2) feature pairs, those of the highest frequencies, rotate; the others get
      theta_i = 0 and carry no position (google-deepmind/gemma's `apply_rope`, whose
      `rope_proportion` this is). Unlike `fraction`, the kept frequencies are those of full RoPE
      (base^(-2i/R) over all R rotated features), and what is dropped is the low-frequency end, which
      the paper finds the model uses as position-free semantic channels. Composes with the other
      options (applied last: dropped pairs stay at 0 under any scaling).
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
    - yarn_dynamic: dynamic YaRN, the YaRN paper's training-free form (Peng et al. 2024, section
      3.3; the authors' LlamaDynamicYaRNScaledRotaryEmbedding, jquesnelle/yarn): YaRN as above with
      s = max(1, (n_max + 1) / L_train), n_max the row's largest key position, and its temperature
      0.1 ln s + 1 with it: plain RoPE within L_train, the window's own YaRN beyond (per row, as
      dynamic NTK decides alpha). yarn_scale stays 1; not combinable with dynamic_ntk, ReRoPE,
      Self-Extend or DCA (a tile cannot know its row's scale).
    - rerope_window (w): ReRoPE (Su 2023, "Transformer升级之路 12: 无限外推的ReRoPE?",
      kexue.fm/archives/9708): the relative position m - n is replaced by min(m - n, w). Realised
      exactly (up to float rounding) through the `bias` hook, which receives the rotated q and k:
      for pairs with m - n > w it adds  scale * (<R(w - m) q'_m, R(-n) k'_n> - <q'_m, k'_n>) / sqrt(K)
      (q', k' rotated at m and n), i.e. it replaces the RoPE logit by <R(w) q_m, k_n> / sqrt(K),
      the logit at relative position w. Keys after the query (masked in a decoder) are left alone.
      Costs two extra q k^T products per layer, as Su's own two-pass implementation. Not combinable
      with xpos (its decay would not be clamped) nor with dynamic_ntk or LongRoPE (a tile cannot
      know its row's alpha or factors).
    - llama3_factor (f), llama3_low_freq_factor (a), llama3_high_freq_factor (b): Llama 3.1's
      scaling (Meta, "The Llama 3 Herd of Models", 2024; meta-llama/llama-models `apply_scaling`,
      HF transformers' `_compute_llama3_parameters`, whose factor / low_freq_factor /
      high_freq_factor / original_max_position_embeddings these are, the last as original_length):
      lambda_i = 2 pi / theta_i; theta_i / f where lambda_i > L_train / a, theta_i where
      lambda_i < L_train / b, and (1 - s) theta_i / f + s theta_i between them, s = (L_train /
      lambda_i - a) / (b - a). The same float32 operations in the same order as HF's, so that from
      the same theta_i the result is the same bit for bit. f = 1 (the default) is off.
    - longrope_short_factor, longrope_long_factor, longrope_factor, longrope_attention_factor:
      LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens";
      Phi-3's rotary embedding; HF transformers' `_compute_longrope_parameters` and
      `longrope_frequency_update`): theta_i <- theta_i / lambda_i with one searched factor per
      feature pair (R/2 of them, R = rotated features): the long factors where the sequence is
      longer than L_train (original_length), the short ones otherwise. HF decides that once per
      batch from its largest position + 1; here it is decided per row, from the row's largest key
      position + 1 > L_train, as dynamic NTK decides its alpha (so, like it, a prefix is encoded
      differently inside a window longer than L_train, and `rotate` must see every key of the
      window at once). cos and sin are multiplied by longrope_attention_factor, or where that is 0
      by HF's default sqrt(1 + ln f / ln L_train) for f = longrope_factor > 1 (else 1), in short and
      long rows alike; the HF loader sets f (HF's factor, or max_position_embeddings /
      original_max_position_embeddings where a Phi-3 config has none). Empty lists (the default)
      are off; lists from config.json are accepted. One of yarn_scale, llama3_factor and LongRoPE
      at a time (each is a whole HF rope type); NTK and PI compose with each.
    - self_extend_window (W), self_extend_group (G): Self-Extend (Jin et al. 2024, "LLM Maybe
      LongLM: Self-Extend LLM Context Window Without Tuning", ICML; datamllab/LongLM's
      `self_extend_patch/Llama.py`): a query at m and a key at n with m - n < W keep their RoPE
      logit (the neighbour window); for m - n >= W the logit is that of q at position
      m // G + W - W // G and k at n // G (the grouped attention), so relative positions beyond W
      grow G times slower and continue from W. The boundary (neighbours while m - n < W) is the
      authors' mask; the shift W - W // G is their decoding code's and their first patch's (their
      4.38 prefill code writes W - W / G, the same whenever G divides W, as in every published
      setting). Realised as ReRoPE is, through `bias`: for m - n >= W it adds the grouped logit
      minus the plain one, from the rotated q and k turned on by (m // G + W - W // G - m) and
      (n // G - n); so it works per tile (dense, triangular, blockwise) on explicit positions;
      the CPU flash kernel takes the same moves as variants of q and k (`position_variants`: each
      pair's logit from its own variant), and the Pallas kernel, which takes a bias only as `bias_fn`,
      refuses it. The positions are
      those given (the authors use sequence indices for the mask: the same for 0 .. T-1).
      Combines with fraction, pi_factor, ntk_alpha, YaRN and Llama 3 (the grouped positions use the
      scaled frequencies, as the patch does with the model's rotary embedding); not with
      rerope_window (both replace the far logits), xpos (its decay would stay at the true
      distance), dynamic_ntk or LongRoPE (a tile cannot know its row's alpha or factors). The
      authors' optional query scaling max(1, log(m + 1) / log(scale_base)) is not part of it; the
      `logn` wrapper around `rope` is that with scale_base = L_train.
    - dca_chunk_size (s), dca_local_window (w): Dual Chunk Attention (An et al. 2024, "Training-Free
      Long-Context Scaling of Large Language Models", ICML; HKUNLP/ChunkLlama's
      `chunkllama_attn_replace.py`). Positions are cut into chunks of c = s - w; every key sits at
      n mod c, and a query at m sees, by the relation of its chunk to the key's: the same chunk,
      m mod c (intra-chunk: the exact relative position m - n, so plain RoPE's logit); the chunk
      before, min(m mod c + c, s) (successive); any earlier chunk, min(2c - 1, s) (inter-chunk).
      No relative position exceeds s, which the authors take as 3/4 of the pretraining length
      with w = 1/16 of it (s = 48, w = 4 at L = 64). Realised as Self-Extend is, through `bias`
      (the logits at the moved positions minus the plain ones, per tile, from explicit positions);
      the authors' three flash-attention calls merged by their log-sum-exps are one softmax over
      the same logits. Combines with fraction, pi_factor (their scaling_factor), ntk_alpha, YaRN
      and Llama 3; not with rerope_window, self_extend_window, xpos, dynamic_ntk or LongRoPE. It
      has no Hugging Face rope_parameters form (export refuses it).
    - xpos, xpos_gamma0, xpos_scale_base: xPos (Sun et al. 2022, "A Length-Extrapolatable
      Transformer"): after the rotation q_m <- q_m * zeta^(m/gamma), k_n <- k_n * zeta^(-n/gamma)
      per feature pair, zeta_i = (2i/d + gamma0)/(1 + gamma0), gamma = xpos_scale_base, so that
      pair i of every score decays by zeta_i^((m - n)/gamma). Positions are centred per call
      (the same centre for q and k, which cancels) to keep the powers in float32 range. The
      paper's blockwise causal attention at inference is not part of the encoding.
    """
    family = "relative"
    citation = "Su et al. 2021"
    extrapolates = "with option"  # plain RoPE degrades; PI / NTK / YaRN / ReRoPE / Self-Extend / DCA at evaluation
    Options = RopeOptions  # traits: a tile bias where ReRoPE, Self-Extend or DCA is on (`bias`)

    def __init__(self, options, dims: ModelDims, *, rngs):
        # Factor lists arrive as lists from config.json: tuples, so that the options stay hashable.
        options = dataclasses.replace(options, **{
            name: tuple(getattr(options, name)) for name in ("longrope_short_factor", "longrope_long_factor")})
        super().__init__(options, dims, rngs=rngs)
        self.rotary_dim = rotary_dim_of(options, dims.head_dim)
        validate_rope_options(options, self.rotary_dim)
        if self.rotary_dim and rope_bias_on(options):
            self.traits = self.traits.replace(bias="tile", moves_positions=True)
        uses_ntk = options.dynamic_ntk or options.ntk_alpha != 1.0
        if uses_ntk and 0 < self.rotary_dim <= 2:
            raise ValueError(f"NTK scaling needs more than 2 rotated features per head, got "
                             f"{self.rotary_dim}; raise rope.fraction")

    def decode_refusal(self):
        if self.options.xpos and self.rotary_dim:
            return (f"positional scheme {self.name!r}: xPos scales q and k about the centre of each call's positions, "
                    f"which differs between a prompt and each new token; generation with a cache does not implement it")
        return super().decode_refusal()

    @property
    def original_length(self) -> int:
        return self.options.original_length or self.dims.train_length

    def _row_length(self, k_pos_BxS: jax.Array) -> jax.Array | None:
        """Each row's largest key position + 1 (B) where an option scales with it (dynamic NTK, dynamic
        YaRN, LongRoPE); None where none does."""
        per_row = self.options.dynamic_ntk or self.options.yarn_dynamic or longrope_on(self.options)
        return jnp.max(k_pos_BxS, axis=-1) + 1 if per_row else None

    def _inv_freq(self, k_pos_BxS: jax.Array) -> jax.Array:
        """R/2, or B x 1 x R/2 with dynamic NTK or LongRoPE (one alpha, one factor set per row)."""
        length_B = self._row_length(k_pos_BxS)
        inv_freq = scaled_inverse_frequencies(self.options, self.rotary_dim, self.original_length, length_B)
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
        mscale = rope_mscale(self.options, self.original_length, self._row_length(k_pos_BxS))
        return (apply_rotary(q_BxTxHxK, q_pos_BxT, inv_freq, q_scale, mscale),
                apply_rotary(k_BxSxHxK, k_pos_BxS, inv_freq, k_scale, mscale))

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        """ReRoPE's, Self-Extend's or Dual Chunk Attention's correction (see the class docstring):
        for each of its position moves, where it applies, the logit at the moved positions minus
        the plain one; None when all three are off."""
        moves = self._position_moves(q_pos_BxT, k_pos_BxS) if self.rotary_dim else []
        if not moves:
            return None
        inv_freq = self._inv_freq(k_pos_BxS)
        near_BxHxTxS = _logits(q_BxTxHxK, k_BxSxHxK)
        scale = q_BxTxHxK.shape[-1] ** -0.5
        bias = jnp.zeros_like(near_BxHxTxS)
        for where_Bx1xTxS, q_shift_BxT, k_shift_BxS in moves:
            def moved(bias, where_Bx1xTxS=where_Bx1xTxS, q_shift_BxT=q_shift_BxT, k_shift_BxS=k_shift_BxS):
                # q, k arrive rotated at m and n (YaRN's factor in them already): rotating them on by the
                # shifts places them at the moved positions.
                far_BxHxTxS = _logits(apply_rotary(q_BxTxHxK, q_shift_BxT, inv_freq),
                                      apply_rotary(k_BxSxHxK, k_shift_BxS, inv_freq))
                return bias + jnp.where(where_Bx1xTxS, (far_BxHxTxS - near_BxHxTxS) * scale, 0.0)
            # a tile of blockwise attention where this move takes no pair (near the diagonal for ReRoPE and
            # Self-Extend; all but one chunk relation for DCA) computes none of its far logits
            bias = jax.lax.cond(where_Bx1xTxS.any(), moved, lambda bias: bias, bias)
        return bias

    def position_variants(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS) -> PositionVariants | None:
        """The same attention as `bias` gives, for a kernel (models/attention/cpu_flash.py): q and k as
        `rotate` returned them, and once more rotated on for each move; a pair takes its logit from
        variant r = the number of `thresholds` that (q_coord - k_coord) reaches. None where no option
        moves positions."""
        rule = self._move_rule(q_pos_BxT, k_pos_BxS) if self.rotary_dim else None
        if rule is None:
            return None
        q_coord, k_coord, thresholds, shifts = rule
        inv_freq = self._inv_freq(k_pos_BxS)
        qs, ks = [q_BxTxHxK], [k_BxSxHxK]
        for q_shift_BxT, k_shift_BxS in shifts:
            qs.append(apply_rotary(q_BxTxHxK, q_shift_BxT, inv_freq))
            ks.append(apply_rotary(k_BxSxHxK, k_shift_BxS, inv_freq))
        return PositionVariants(tuple(qs), tuple(ks), q_coord, k_coord, thresholds)

    def _position_moves(self, q_pos_BxT, k_pos_BxS) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
        """[(where B x 1 x T x S, query shift B x T, key shift B x S)]: the (query, key) pairs whose
        logit is taken at other positions, and by how much each query and key moves. Their wheres
        are disjoint; keys after the query (masked in a decoder) are never moved."""
        rule = self._move_rule(q_pos_BxT, k_pos_BxS)
        if rule is None:
            return []
        q_coord, k_coord, thresholds, shifts = rule
        apart_Bx1xTxS = (q_coord[:, :, None] - k_coord[:, None, :])[:, None]
        moves = []
        for i, (q_shift_BxT, k_shift_BxS) in enumerate(shifts):
            where_Bx1xTxS = apart_Bx1xTxS >= thresholds[i]
            if i + 1 < len(thresholds):
                where_Bx1xTxS &= apart_Bx1xTxS < thresholds[i + 1]
            moves.append((where_Bx1xTxS, q_shift_BxT, k_shift_BxS))
        return moves

    def _move_rule(self, q_pos_BxT, k_pos_BxS):
        """(query coordinates B x T, key coordinates B x S, increasing thresholds, [(query shift B x T,
        key shift B x S)] per threshold) or None: the pairs whose coordinates differ by at least
        thresholds[i] (and less than the next) are moved by shifts[i]."""
        o = self.options
        if o.rerope_window:  # beyond the window, q at w and k at 0: relative position w
            return q_pos_BxT, k_pos_BxS, (o.rerope_window + 1,), [(o.rerope_window - q_pos_BxT, -k_pos_BxS)]
        if o.self_extend_window:  # grouped positions m // G + W - W // G and n // G
            window, group = o.self_extend_window, o.self_extend_group
            return q_pos_BxT, k_pos_BxS, (window,), [
                (q_pos_BxT // group + (window - window // group) - q_pos_BxT, k_pos_BxS // group - k_pos_BxS)]
        if o.dca_chunk_size:  # keys at n mod c; queries by the chunk relation (1: successive, 2+: inter)
            size, chunk = o.dca_chunk_size, o.dca_chunk_size - o.dca_local_window
            k_shift = k_pos_BxS % chunk - k_pos_BxS
            successive = jnp.minimum(q_pos_BxT % chunk + chunk, size) - q_pos_BxT
            inter = min(2 * chunk - 1, size) - q_pos_BxT
            return q_pos_BxT // chunk, k_pos_BxS // chunk, (1, 2), [(successive, k_shift), (inter, k_shift)]
        return None


class PositionVariants(NamedTuple):
    """`Rope.position_variants`: q (B x T x H x K) and k (B x S x G x K, as many heads
    as given) per variant, the plain ones
    first; int32 coordinates of queries (B x T) and keys (B x S); the thresholds (increasing) at which
    the coordinate difference of a pair passes to the next variant."""
    qs: tuple
    ks: tuple
    q_coord: jax.Array
    k_coord: jax.Array
    thresholds: tuple[int, ...]


def _logits(q_BxTxHxK, k_BxSxHxK):
    """q k^T, float32 B x H x T x S (unscaled)."""
    return jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK, preferred_element_type=jnp.float32)


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
