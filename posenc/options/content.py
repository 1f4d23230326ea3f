"""Options of the schemes that read content (queries, keys or the layer's input) or change the
attention weights: Shaw, Transformer-XL, DeBERTa, TUPE, CoPE, FoX and stick-breaking."""
from __future__ import annotations

import dataclasses

from posenc.domains import above, at_least, between, one_of, positive
from posenc.options.bias import T5_MAX_EXACT, t5_max_exact
from posenc.options.declare import declare


@dataclasses.dataclass(frozen=True)
class ShawOptions:
    max_relative_position: int = 16  # k: distances are clipped to [-k, k] (the paper's k = 16)
    value_term: bool = True          # also add sum_j a_ij R^V_{ij} to the output (the paper's eq. 3)
    DOMAINS = {"max_relative_position": at_least(0)}


@dataclasses.dataclass(frozen=True)
class TransformerXLOptions:
    base: float = 10000.0  # wavelength base of the sinusoidal relative encodings R
    DOMAINS = {"base": positive()}


@dataclasses.dataclass(frozen=True)
class DebertaOptions:
    max_relative_positions: int = 512  # k: 2k relative embeddings (released DeBERTa: k = 512)
    p2c_index: str = "code"  # "code": K^c_j . Q^r at i - j + k (released code); "paper": j - i + k
    DOMAINS = {"max_relative_positions": at_least(1), "p2c_index": one_of("code", "paper")}


@dataclasses.dataclass(frozen=True)
class TupeOptions:
    max_length: int = 0        # rows of the absolute table p; 0 means the training length
    relative: bool = True      # TUPE-R (add T5's b_{j-i}); False gives TUPE-A
    num_buckets: int = 32      # of b_{j-i}, as T5
    max_distance: int = 128
    bidirectional: bool = False  # a causal decoder only sees the past
    DOMAINS = {"max_length": at_least(0, note="0 = the training length"), "num_buckets": at_least(2),
               "max_distance": above(t5_max_exact, T5_MAX_EXACT)}


@dataclasses.dataclass(frozen=True)
class CopeOptions:
    max_positions: int = 0  # rows of e (P); 0 means train_length + 1, every count seen in training
    DOMAINS = {"max_positions": at_least(0, note="0 = train_length + 1")}


@dataclasses.dataclass(frozen=True)
class FoxOptions:
    gate_bias_init: float = 0.0  # b's initial value: 0 in the authors' code (f starts near 1/2);
                                 # x-transformers' data-dependent ALiBi starts it at 5 (f near 0.99)
    DOMAINS = {"gate_bias_init": between(note="sigmoid(b) is the forget gate's starting value")}


@dataclasses.dataclass(frozen=True)
class StickbreakingOptions:
    attend_current: bool = False  # whether a query also breaks its stick at its own key (the
                                  # reference kernels' default: no)
    remainder: str = "value"      # where the stick left over goes: "value", the query's own value
                                  # (the authors' reference test, o + rem * v), or "none" (dropped)
    DOMAINS = {"remainder": one_of("value", "none")}


declare("shaw", ShawOptions, "posenc.relative_content")
declare("transformer_xl", TransformerXLOptions, "posenc.relative_content")
declare("deberta", DebertaOptions, "posenc.relative_content")
declare("tupe", TupeOptions, "posenc.relative_content")
declare("cope", CopeOptions, "posenc.cope")
declare("fox", FoxOptions, "posenc.fox")
declare("stickbreaking", StickbreakingOptions, "posenc.stickbreaking")
