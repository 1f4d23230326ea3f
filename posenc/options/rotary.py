"""Options of the rotary family: RoPE with its evaluation-time extensions (the frequency scalings
of posenc/rope_scaling.py, ReRoPE, Self-Extend, Dual Chunk Attention, xPos, p-RoPE; how they
combine is checked by `rope_scaling.validate_rope_options`), xPos, FoPE and PoPE."""
from __future__ import annotations

import dataclasses

from posenc.domains import above, at_least, between, each, one_of, only_with, positive, unit_interval
from posenc.options.declare import declare

YARN_RAMPS = ("index", "turns")
POPE_BIAS_INITS = ("zeros", "uniform")


# Whether a method is on, from the options of its section (posenc/domains.py: only_with).
def _yarn_on(o) -> bool:
    return o["yarn_scale"] != 1 or bool(o.get("yarn_dynamic"))


def _llama3_on(o) -> bool:
    return o["llama3_factor"] != 1


def _longrope_on(o) -> bool:
    return bool(o["longrope_short_factor"] or o["longrope_long_factor"])


def _xpos_on(o) -> bool:
    return bool(o["xpos"])


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
    yarn_dynamic: bool = False    # dynamic YaRN: s = max(1, (largest key position + 1) / L_train), per row
    yarn_beta_fast: float = 32.0  # beta: frequencies with more than beta turns in L_train are kept
    yarn_beta_slow: float = 1.0   # alpha: frequencies with fewer than alpha turns are interpolated
    yarn_temperature: bool = True # rotated features x (0.1 ln s + 1) in q and k; False = "NTK-by-parts"
    yarn_ramp: str = "index"      # "index": the authors' code (linear in the feature index between
                                  # whole correction dimensions); "turns": the paper's equation (linear in r)
    original_length: int = 0      # L_train that YaRN, dynamic NTK, Llama 3 and LongRoPE scale from (HF's
                                  # original_max_position_embeddings); 0 = this run's training length.
                                  # A run extended from a shorter one (train.init_from) sets the base's.
    llama3_factor: float = 1.0    # Llama 3.1 scaling (HF "llama3"): low frequencies / factor (1 = off)
    llama3_low_freq_factor: float = 1.0   # wavelengths > L_train / this are divided by llama3_factor
    llama3_high_freq_factor: float = 4.0  # wavelengths < L_train / this are kept; smooth in between
    longrope_short_factor: tuple = ()  # LongRoPE (HF "longrope"): theta_i / short_factor_i in rows whose
                                       # largest key position + 1 <= L_train, one factor per pair (() = off)
    longrope_long_factor: tuple = ()   # theta_i / long_factor_i in rows beyond L_train
    longrope_factor: float = 1.0       # HF's "factor" (L_target / L_train): sets the default attention factor
    longrope_attention_factor: float = 0.0  # cos and sin x this; 0 = sqrt(1 + ln f / ln L_train) if f > 1, else 1
    rerope_window: int = 0        # ReRoPE: relative positions beyond w count as w (0 = off)
    self_extend_window: int = 0   # Self-Extend: W, exact relative positions while m - n < W (0 = off)
    self_extend_group: int = 1    # G: beyond W, q at m // G + W - W // G and k at n // G
    dca_chunk_size: int = 0       # Dual Chunk Attention: s, keys in chunks of c = s - w positions (0 = off)
    dca_local_window: int = 0     # w: the successive chunk's queries sit at most s from its keys
    xpos: bool = False            # xPos: q x zeta^(m/gamma), k x zeta^(-n/gamma)
    xpos_gamma0: float = 0.4      # zeta_i = (2i/d + gamma0) / (1 + gamma0)
    xpos_scale_base: float = 512.0  # gamma
    p_rope: float = 1.0           # p-RoPE: share of the frequency pairs that rotate, the highest ones;
                                  # the others get frequency 0 (position-free). 1 = off (plain RoPE)
    # Each option alone (validate_rope_options checks how they combine); an option of one method
    # (`only_with`) keeps its default unless the method is switched on: alone it would change nothing.
    DOMAINS = {"base": positive(), "fraction": unit_interval(), "pi_factor": positive(note="L_train / L_target"),
               "ntk_alpha": positive(),
               "dynamic_ntk_factor": only_with(lambda o: o["dynamic_ntk"], "dynamic_ntk", at_least(1), 1.0),
               "yarn_scale": at_least(1, note="L_target / L_train; 1 = off"),
               "yarn_beta_fast": only_with(_yarn_on, "yarn_scale (or yarn_dynamic)", positive(), 32.0),
               "yarn_beta_slow": only_with(_yarn_on, "yarn_scale (or yarn_dynamic)", between(0, lo_open=True, note="and < yarn_beta_fast"),
                                           1.0),
               "yarn_ramp": only_with(_yarn_on, "yarn_scale (or yarn_dynamic)", one_of("index", "turns"), "index"),
               "original_length": at_least(0, note="0 = the training length"),
               "llama3_factor": at_least(1, note="1 = off"),
               "llama3_low_freq_factor": only_with(_llama3_on, "llama3_factor", positive(), 1.0),
               "llama3_high_freq_factor": only_with(_llama3_on, "llama3_factor", above(
                   lambda o: o["llama3_low_freq_factor"], "llama3_low_freq_factor"), 4.0),
               "longrope_short_factor": each(positive()), "longrope_long_factor": each(positive()),
               "longrope_factor": only_with(_longrope_on, "longrope_short_factor / long_factor", positive(), 1.0),
               "longrope_attention_factor": only_with(_longrope_on, "longrope_short_factor / long_factor",
                                                      at_least(0, note="0 = HF's default"), 0.0),
               "rerope_window": at_least(0, note="0 = off"), "self_extend_window": at_least(0, note="0 = off"),
               "self_extend_group": only_with(lambda o: o["self_extend_window"] > 0, "self_extend_window",
                                              at_least(1), 1),
               "xpos_gamma0": only_with(_xpos_on, "xpos", positive(), 0.4),
               "xpos_scale_base": only_with(_xpos_on, "xpos", positive(), 512.0),
               "p_rope": unit_interval(note="1 = plain RoPE"), "dca_chunk_size": at_least(0, note="0 = off"),
               "dca_local_window": only_with(lambda o: o["dca_chunk_size"] > 0, "dca_chunk_size (Dual Chunk Attention)",
                                             at_least(0, note="and < dca_chunk_size"), 0)}


def longrope_on(options: RopeOptions) -> bool:
    return bool(options.longrope_short_factor or options.longrope_long_factor)


def rope_bias_on(options: RopeOptions) -> bool:
    """Whether an option that `rope` realises through its `bias` hook is on (ReRoPE, Self-Extend, DCA)."""
    return bool(options.rerope_window or options.self_extend_window or options.dca_chunk_size)


@dataclasses.dataclass(frozen=True)
class XposOptions(RopeOptions):
    xpos: bool = True


@dataclasses.dataclass(frozen=True)
class FopeOptions:
    base: float = 10000.0     # RoPE's base, for the frequencies the series are made of
    init_gain: float = 0.3    # gain of the random coefficients beside the identity (reference: 0.3)
    floor_ratio: float = 1.0  # frequencies below floor_ratio * 2 pi / L_train are clipped to zero
    seed: int = 0             # the coefficients' draw (fixed, not trained, as in the reference)
    DOMAINS = {"base": above(lambda o: 1, "1"), "init_gain": at_least(0, note="0 = RoPE with clipped frequencies"),
               "floor_ratio": at_least(0, note="0 = keep every frequency"), "seed": at_least(0)}


@dataclasses.dataclass(frozen=True)
class PopeOptions:
    base: float = 10000.0      # theta_c = base^(-c/K)
    bias_init: str = "zeros"   # the phase bias delta: "zeros" (x-transformers' default) or "uniform" on [-2 pi, 0]
    DOMAINS = {"base": above(lambda o: 1, "1"), "bias_init": one_of(*POPE_BIAS_INITS)}


declare("rope", RopeOptions, "posenc.rotary")
declare("xpos", XposOptions, "posenc.rotary")
declare("fope", FopeOptions, "posenc.fope")
declare("pope", PopeOptions, "posenc.pope")
