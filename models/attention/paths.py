"""The attention paths: one row per implementation, saying how to run it and which calls it refuses.

  dense       dense.py: one T x T matrix, every scheme, dropout included (lambda_mask.py under the
              Lambda mask; stickbreaking.py for a stick-breaking scheme, chosen in dense.py)
  triangular  triangular.py: the row tiles on and below the diagonal, a hand-written backward pass
  blockwise   blockwise.py: tile by tile with an online softmax, O(T * block) memory, no dropout
  fused       fused.py: `jax.nn.dot_product_attention`, cuDNN on GPU (XLA's composite elsewhere), no dropout
  pallas      pallas.py: a flash-attention kernel (compiled on GPU, interpreted elsewhere)

Each row's `accepts(traits, shape)` decides from the scheme's traits (posenc/traits.py) and the
call's `Shape` alone, before anything is traced, and returns None or the refusal: one line naming
the scheme, the option and what to use instead. The kernels themselves trust their caller:
`choice.choose` asks `accepts` before a model runs a path, and so do the device check (verify.py)
and the self-check. Which path runs is policy (choice.py); what a path is, is here. A new path is a
module with its kernel and a row below.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from models.attention import pallas
from models.attention.blockwise import blockwise_attention
from models.attention.dense import NO_DROPOUT, Dropout, dense_attention
from models.attention.fused import fused_attention
from models.attention.lambda_mask import LambdaMask, lambda_dense_attention
from models.attention.triangular import triangular_attention
from models.config import DEFAULT_BLOCK
from posenc import Scheme, Traits


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
    launch: pallas.Launch | None = None


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a refusal may depend on besides the scheme's traits: the scheme's name (to say so), the
    sequence length, whether attention dropout is on, whether the Lambda mask is."""
    scheme: str
    length: int
    dropping: bool = False
    masked: bool = False


def _never() -> bool:
    return False


def _whole_rows(block: int) -> int | None:
    return None


@dataclasses.dataclass(frozen=True)
class Path:
    """One attention implementation.

    - run(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, call) -> out_BxTxHxK: the path, its variants chosen inside.
    - accepts(traits, shape) -> None | str: None where it can run the call, else why not (one line).
    - label: what it is, in words (the device check's reports).
    - xla: XLA's own code on every backend (the self-check judges every row against these).
    - baseline: one of XLA's paths at training lengths, which the device check holds a kernel to.
    - checked(): whether on this backend it runs a kernel outside XLA's own code (the Pallas kernel
      compiled, cuDNN's) that must pass the device check (verify.py) before use.
    - tile(block): the key-tile width it runs with at `model.attention_block` (None: whole rows),
      for the evaluation batch policy.
    - tuned: its launch configuration is searched per device (tuning.py) and given as `Call.launch`.
    - per_device: XLA has no rule to partition it, so training on several devices runs it per device.
    """
    run: Callable[..., jax.Array]
    accepts: Callable[[Traits, Shape], str | None]
    label: str
    xla: bool = False
    baseline: bool = False
    checked: Callable[[], bool] = _never
    tile: Callable[[int], int | None] = _whole_rows
    tuned: bool = False
    per_device: bool = False

    def refuse(self, traits: Traits, shape: Shape) -> None:
        """Raise the path's refusal (ValueError), if it has one."""
        refusal = self.accepts(traits, shape)
        if refusal:
            raise ValueError(refusal)


# ---- the sentences several paths share -----------------------------------------------------------

MASK_OPTIONS = "model.attention_sinks / model.attention_window"


def without_dropout(path: str) -> str:
    return (f"model.attention={path} does not implement attention dropout; set --config.model.attention=dense "
            f"(or auto) for training with it")


def masked_dropout(shape: Shape) -> str | None:
    if shape.masked and shape.dropping:
        return (f"the Lambda mask ({MASK_OPTIONS}) is an evaluation option and does not implement attention "
                f"dropout; leave both at 0 for training")
    return None


def without_mask(path: str, shape: Shape) -> str | None:
    """The refusal of a path that cannot apply the Lambda mask, where it is on."""
    if not shape.masked:
        return None
    return masked_dropout(shape) or (f"model.attention={path} cannot apply the Lambda mask ({MASK_OPTIONS}); set "
                                     f"--config.model.attention=dense, blockwise or auto")


def under_mask(traits: Traits, shape: Shape) -> str | None:
    """The refusal of a path that applies the Lambda mask, where it is on: a scheme whose weights are
    not a softmax, or whose bias needs whole rows, has no window to cut."""
    refusal = masked_dropout(shape)
    if refusal is None and shape.masked and (traits.needs_full_rows or traits.normalization != "softmax"):
        refusal = (f"positional scheme {shape.scheme!r} needs whole rows of keys or is not a softmax; the Lambda "
                   f"mask ({MASK_OPTIONS}) cannot apply to it: leave both at 0")
    return refusal


def _rows_of_tiles(traits: Traits) -> bool:
    """A rotation and / or an additive bias with at most a per-query logit scale, under a softmax:
    what can be computed from independent tiles of logits."""
    return not (traits.needs_full_rows or traits.transforms_logits or traits.normalization != "softmax"
                or traits.value_term or traits.logit_scale == "per_pair")


# ---- the rows ----------------------------------------------------------------------------------------

def dense_accepts(traits: Traits, shape: Shape) -> str | None:
    """Every scheme; under the Lambda mask, softmax schemes of tile biases; stick-breaking without dropout."""
    refusal = under_mask(traits, shape)
    if refusal is None and shape.dropping and traits.normalization == "stickbreaking":
        refusal = (f"positional scheme {shape.scheme!r} (stick-breaking attention) does not implement attention "
                   f"dropout; set --config.model.attention_dropout=0")
    return refusal


def dense_run(q, k, v, call: Call) -> jax.Array:
    if call.mask is not None:
        return lambda_dense_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.mask, call.context)
    causal_TxS = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), dtype=bool))
    return dense_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, causal_TxS, call.dropout, call.context)


def triangular_accepts(traits: Traits, shape: Shape) -> str | None:
    refusal = without_mask("triangular", shape)
    if refusal is None and not _rows_of_tiles(traits):
        refusal = (f"positional scheme {shape.scheme!r} adds a value term, scales logits per key, needs whole rows, "
                   f"transforms logits or is not a softmax; model.attention=triangular cannot express it: use "
                   f"dense or auto")
    return refusal


def triangular_run(q, k, v, call: Call) -> jax.Array:
    return triangular_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.dropout, call.context)


def blockwise_accepts(traits: Traits, shape: Shape) -> str | None:
    if shape.dropping:
        return without_dropout("blockwise")
    if traits.needs_whole_rows:
        return (f"positional scheme {shape.scheme!r} needs whole rows of keys for its bias and has no "
                f"carried_bias; set --config.model.attention=dense (or auto)")
    return under_mask(traits, shape)


def blockwise_run(q, k, v, call: Call) -> jax.Array:
    return blockwise_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.block, context_BxTxC=call.context,
                               mask=call.mask)


def fused_accepts(traits: Traits, shape: Shape) -> str | None:
    if shape.dropping:
        return without_dropout("fused")
    refusal = without_mask("fused", shape)
    if refusal is None and not (_rows_of_tiles(traits) and traits.logit_scale == "none"):
        refusal = (f"positional scheme {shape.scheme!r} scales or transforms logits, adds a value term, needs whole "
                   f"rows or is not a softmax; model.attention=fused cannot express it: use dense or blockwise")
    return refusal


def fused_run(q, k, v, call: Call) -> jax.Array:
    return fused_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.context)


def pallas_accepts(traits: Traits, shape: Shape) -> str | None:
    refusal = without_mask("pallas", shape)
    if refusal is None and not (_rows_of_tiles(traits) and not traits.reads_input
                                and traits.bias in ("none", "function")):
        refusal = (f"positional scheme {shape.scheme!r} adds a value term, scales logits per key, needs whole rows, "
                   f"has a bias without `bias_fn` or from the layer's input, transforms logits or is not a "
                   f"softmax; model.attention=pallas cannot express it: use auto, dense or triangular")
    return refusal


def pallas_run(q, k, v, call: Call) -> jax.Array:
    launch = call.launch if call.launch is not None else pallas.Launch()
    return pallas.pallas_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.dropout, launch)


PATHS: dict[str, Path] = {
    "dense": Path(dense_run, dense_accepts, "dense attention (model.attention=dense)", xla=True, baseline=True),
    "triangular": Path(triangular_run, triangular_accepts, "triangular attention (model.attention=triangular)",
                       xla=True, baseline=True),
    "blockwise": Path(blockwise_run, blockwise_accepts, "blockwise attention (model.attention=blockwise)", xla=True,
                      tile=lambda block: block),
    "fused": Path(fused_run, fused_accepts, "jax.nn.dot_product_attention (model.attention=fused)",
                  checked=lambda: jax.default_backend() == "gpu"),
    "pallas": Path(pallas_run, pallas_accepts, "the Pallas kernel", checked=lambda: not pallas.interpreted(),
                   tile=lambda block: pallas.BLOCK, tuned=True, per_device=True),
}
