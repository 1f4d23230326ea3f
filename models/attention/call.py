"""What describes one self-attention call, apart from q, k and v: `Call`, what every path's `run`
takes (positions, scheme, `Dropout`, the Lambda mask ...), and `CallSpec`, what a path's refusal may
depend on (the sequence length, head size, dtype, dropout, mask, whether it trains), decided before
anything is traced (models/attention/paths.py). Kept apart from paths.py so that a path's module
(dense.py, blockwise.py) can take a `Call` without importing the table."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models.attention.lambda_mask import LambdaMask
from models.config import DEFAULT_BLOCK
from posenc import Scheme


@dataclasses.dataclass(frozen=True)
class Dropout:
    """Attention dropout: the rate, and the key to draw its mask from (None: evaluation, no dropout)."""
    rate: float = 0.0
    key: jax.Array | None = None

    @property
    def active(self) -> bool:
        return self.key is not None and self.rate > 0


NO_DROPOUT = Dropout()


@dataclasses.dataclass(frozen=True)
class Call:
    """One self-attention call besides q, k and v: the query and key positions, the scheme, attention
    dropout, the scheme's `token_context` of the layer's input (None unless it reads one: FoX),
    LM-Infinite's Lambda mask (None: causal), the key-tile width of tiled paths
    (`model.attention_block`), and the Pallas kernel's launch configuration (None: its default)."""
    q_pos: jax.Array
    k_pos: jax.Array
    scheme: Scheme
    dropout: Dropout = NO_DROPOUT
    context: jax.Array | None = None
    mask: LambdaMask | None = None
    block: int = DEFAULT_BLOCK
    launch: object | None = None  # a pallas.Launch (not imported: pallas.py imports this module)


@dataclasses.dataclass(frozen=True)
class CallSpec:
    """What a refusal may depend on besides the scheme's traits: the scheme's name (to say so), the
    sequence length, the features per head of q and k and the compute dtype's name (the kernels'
    shape limits), whether attention dropout is on, whether the Lambda mask is (and with sinks, or a
    plain sliding window), and whether the call is differentiated (`training`: cuDNN's backward pass
    takes fewer shapes than its forward)."""
    scheme: str
    length: int
    head_dim: int
    dtype: str
    dropping: bool = False
    masked: bool = False
    training: bool = False
    sinks: bool = False

    @classmethod
    def of(cls, scheme: Scheme, length: int, dtype, **flags) -> "CallSpec":
        """The spec of a call of `scheme` at `length` in `dtype`: its name, and the head size its
        rotation gives q and k (`rotated_width`)."""
        return cls(scheme.name, length, rotated_width(scheme), jnp.dtype(dtype).name, **flags)


def rotated_width(scheme: Scheme) -> int:
    """Features per head of q and k after `scheme.rotate` (what a kernel takes: PoPE doubles them),
    from an abstract evaluation (no computation; works inside a model's trace too)."""
    q = jax.ShapeDtypeStruct((1, 1, scheme.dims.num_heads, scheme.dims.head_dim), jnp.float32)
    pos = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    return jax.eval_shape(lambda q, pos: scheme.rotate(q, q, pos, pos)[0], q, pos).shape[-1]
