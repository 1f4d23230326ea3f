"""Options of the schemes whose logits bias is a function of positions alone: ALiBi, T5, KERPLE,
Sandwich and FIRE."""
from __future__ import annotations

import dataclasses

from posenc.domains import above, at_least, between, positive, satisfies
from posenc.options.declare import NoOptions, declare

T5_MAX_EXACT = "the exact distances, num_buckets // 2 (// 4 when bidirectional)"


def t5_max_exact(options) -> int:
    """The distances T5's buckets hold one by one; max_distance must exceed it (the log-spaced
    buckets divide by log(max_distance / max_exact))."""
    return options["num_buckets"] // (4 if options["bidirectional"] else 2)


@dataclasses.dataclass(frozen=True)
class T5Options:
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = False  # a causal decoder only sees the past
    DOMAINS = {"num_buckets": at_least(2), "max_distance": above(t5_max_exact, T5_MAX_EXACT)}


@dataclasses.dataclass(frozen=True)
class KerpleLogOptions:
    r1_init_max: float = 2.0  # r1 starts uniform in (init_min, r1_init_max), one per head
    r2_init_max: float = 1.0  # r2 starts uniform in (init_min, r2_init_max), one per head
    init_min: float = 0.01
    per_layer: bool = False   # False: one (r1, r2) for the whole stack, as the authors' code
    DOMAINS = {"init_min": positive(), "r1_init_max": above(lambda o: o["init_min"], "init_min"),
               "r2_init_max": above(lambda o: o["init_min"], "init_min")}


@dataclasses.dataclass(frozen=True)
class KerplePowerOptions:
    r1_init_max: float = 1.0  # r1 starts uniform in (init_min, r1_init_max), one per head
    r2_init_max: float = 1.99  # r2 starts uniform in (init_min, r2_init_max); r2 < 2 always
    init_min: float = 0.01
    per_layer: bool = False   # False: one (r1, r2) for the whole stack, as the authors' code
    DOMAINS = {"init_min": between(0, 2, lo_open=True, hi_open=True),
               "r1_init_max": above(lambda o: o["init_min"], "init_min"),
               "r2_init_max": satisfies(lambda v, o: o["init_min"] < v < 2, "in (init_min, 2)", 1.99)}


@dataclasses.dataclass(frozen=True)
class SandwichOptions:
    dim: int = 128         # d': width of the sinusoidal vectors whose inner product is the bias;
                           # 0 means the head dimension (NeMo's choice)
    base: float = 10000.0
    DOMAINS = {"dim": satisfies(lambda v, _: v == 0 or (v >= 2 and v % 2 == 0),
                                "0 (the head dimension) or an even number >= 2"),
               "base": positive()}


@dataclasses.dataclass(frozen=True)
class FireOptions:
    hidden: int = 32               # width of f_theta's hidden layer
    c_init: float = 0.1            # initial c of psi(x) = log(|c x| + 1) (reference: 0.1)
    threshold_init: float = 512.0  # L_0 of the threshold L = |m L_0|, m learned from 1 (reference:
                                   # 512); 0 means the training length
    DOMAINS = {"hidden": at_least(1), "c_init": positive(),
               "threshold_init": at_least(0, note="0 = the training length")}


declare("alibi", NoOptions, "posenc.bias")
declare("t5", T5Options, "posenc.bias")
declare("kerple_log", KerpleLogOptions, "posenc.kerple")
declare("kerple_power", KerplePowerOptions, "posenc.kerple")
declare("sandwich", SandwichOptions, "posenc.sandwich")
declare("fire", FireOptions, "posenc.fire")
