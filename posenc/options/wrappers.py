"""Options of the schemes that wrap another registered scheme (named by their option `base`): log-n
scaling, Scalable-Softmax, randomized positions, PoSE and DAPE."""
from __future__ import annotations

import dataclasses

from posenc.domains import at_least, one_of, positive
from posenc.options.declare import REGISTERED, declare


@dataclasses.dataclass(frozen=True)
class LognOptions:
    base: str = "rope"  # the wrapped scheme (RoPE: the pairing of Su 2021 and later long-context LMs)
    DOMAINS = {"base": REGISTERED}


@dataclasses.dataclass(frozen=True)
class SsmaxOptions:
    base: str = "rope"    # the wrapped scheme (the paper's models use RoPE)
    s_init: float = 0.43  # s of every head at initialisation (the reference's default)
    bias: bool = False    # the paper's variant with a learned b per head: (s log n + b) z
    DOMAINS = {"base": REGISTERED, "s_init": positive(note="the reference's 0.43")}


@dataclasses.dataclass(frozen=True)
class RandomizedOptions:
    base: str = "rope"    # the wrapped scheme
    max_length: int = 0   # L, the range positions are drawn from; 0 means 16 x train_length
    eval_positions: str = "sampled"  # "sampled" (the reference's) or "consecutive" (0 .. T-1)
    DOMAINS = {"base": REGISTERED, "max_length": at_least(0, note="0 = 16 x train_length"),
               "eval_positions": one_of("sampled", "consecutive")}


@dataclasses.dataclass(frozen=True)
class PoseOptions:
    base: str = "rope"       # the wrapped scheme (the paper's models use RoPE)
    target_length: int = 0   # L_t, the length simulated in training; 0 means 16 x train_length
    DOMAINS = {"base": REGISTERED, "target_length": at_least(0, note="0 = 16 x train_length; else >= it")}


@dataclasses.dataclass(frozen=True)
class DapeOptions:
    base: str = "kerple_log"  # the bias refined: the paper's ALiBi, KERPLE (its best) or FIRE; any scheme works
    hidden: int = 32          # the MLP's width (the reference's mlp_width)
    DOMAINS = {"base": REGISTERED, "hidden": at_least(1)}


declare("logn", LognOptions, "posenc.wrappers", wrapper=True)
declare("ssmax", SsmaxOptions, "posenc.wrappers", wrapper=True)
declare("randomized", RandomizedOptions, "posenc.wrappers", wrapper=True)
declare("pose", PoseOptions, "posenc.pose", wrapper=True)
declare("dape", DapeOptions, "posenc.dape", wrapper=True)
