"""Options of the schemes that encode absolute positions in the embeddings (or in an input
convolution): NoPE, sinusoidal, learned, hierarchical, multiplicative, the naive encodings,
FLOATER, complex order and the causal convolution."""
from __future__ import annotations

import dataclasses

from posenc.domains import at_least, between, one_of, positive
from posenc.options.declare import NoOptions, declare


@dataclasses.dataclass(frozen=True)
class SinusoidalOptions:
    base: float = 10000.0
    layout: str = "fairseq"  # "fairseq": the ALiBi paper's baseline; "vaswani": interleaved, from 0
    DOMAINS = {"base": positive(), "layout": one_of("fairseq", "vaswani")}


@dataclasses.dataclass(frozen=True)
class LearnedOptions:
    max_length: int = 0  # rows of the table; 0 means the training length
    DOMAINS = {"max_length": at_least(0, note="0 = the training length")}


@dataclasses.dataclass(frozen=True)
class HierarchicalOptions:
    max_length: int = 0  # n, rows of the learned table; 0 means the training length
    alpha: float = 0.4   # evaluation-time: the weight of the "high digit" i
    DOMAINS = {"max_length": at_least(0, note="0 = the training length"),
               "alpha": between(0, 1, lo_open=True, hi_open=True)}


@dataclasses.dataclass(frozen=True)
class MultiplicativeOptions:
    table: str = "sinusoidal"  # "sinusoidal" (fixed) | "learned" (max_length rows)
    base: float = 10000.0      # of the sinusoidal table (also the learned table's initial value)
    max_length: int = 0        # rows of the learned table; 0 means the training length
    offset: float = 0.0        # x * (offset + PE(p)); 0 is the literature's x * PE(p)
    DOMAINS = {"table": one_of("sinusoidal", "learned"), "base": positive(),
               "max_length": at_least(0, note="0 = the training length"), "offset": between()}


@dataclasses.dataclass(frozen=True)
class NormalizedOptions:
    # "train_length": p / (L_train - 1). "row": p / (largest position of the row), the textbook
    # definition; it makes a token's encoding depend on the length of its window (see the class).
    denominator: str = "train_length"
    DOMAINS = {"denominator": one_of("train_length", "row")}


@dataclasses.dataclass(frozen=True)
class BinaryOptions:
    max_bits: int = 16  # digits on the first max_bits features: positions 0 .. 2**max_bits - 1
    DOMAINS = {"max_bits": between(1, 30, note="and <= d_model")}


@dataclasses.dataclass(frozen=True)
class FloaterOptions:
    steps_per_unit: int = 4   # RK4 steps per unit of position (accuracy vs sequential cost)
    hidden_dim: int = 0       # width of the MLP h; 0 means d_model
    extra_positions: int = 0  # integrate this far beyond T-1 under jit (for offset positions)
    DOMAINS = {"steps_per_unit": at_least(1), "hidden_dim": at_least(0, note="0 = d_model"),
               "extra_positions": at_least(0)}


@dataclasses.dataclass(frozen=True)
class ConvOptions:
    kernel_size: int = 3    # tokens each output sees (the current one and K-1 before it)
    depthwise: bool = True  # one filter per feature (K x D); False: a full K x D x D convolution
    DOMAINS = {"kernel_size": at_least(1)}


declare("nope", NoOptions, "posenc.absolute")
declare("sinusoidal", SinusoidalOptions, "posenc.absolute")
declare("learned", LearnedOptions, "posenc.absolute")
declare("hierarchical", HierarchicalOptions, "posenc.hierarchical")
declare("multiplicative", MultiplicativeOptions, "posenc.multiplicative")
declare("integer", NoOptions, "posenc.naive")
declare("normalized", NormalizedOptions, "posenc.naive")
declare("binary", BinaryOptions, "posenc.naive")
declare("floater", FloaterOptions, "posenc.floater")
declare("complex_order", NoOptions, "posenc.complex_order")
declare("conv", ConvOptions, "posenc.conv")
