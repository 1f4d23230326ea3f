"""The attention paths: one row per implementation, saying how to run it and which calls it refuses.

  dense       dense.py: one T x T matrix, every scheme, dropout included (lambda_mask.py under the
              Lambda mask; stickbreaking.py for a stick-breaking scheme, chosen in dense.py)
  triangular  triangular.py: the row tiles on and below the diagonal, a hand-written backward pass
  blockwise   blockwise.py: tile by tile with an online softmax, O(T * block) memory, no dropout
  fused       fused.py: `jax.nn.dot_product_attention`, cuDNN on GPU (XLA's composite elsewhere), no dropout
  pallas      pallas.py: a flash-attention kernel (compiled on GPU, interpreted elsewhere)
  cpu_flash   cpu_flash.py: a flash-attention kernel in C++ for the CPU, forward only (compiled on the machine
              at first use: native/), grouped-query keys and values read in place

Each row's `accepts(traits, spec)` decides from the scheme's traits (posenc/traits.py) and the
call's `CallSpec` (call.py: length, head size, dtype, dropout, mask, training) alone, before
anything is traced, and returns None or the refusal: one line naming the scheme or the option and
what to use instead. Every refusal is here, the kernels' shape limits on this backend included
(cuDNN's dtypes, head sizes and odd training lengths; the compiled Pallas kernel's head sizes and
shared memory); the kernels themselves trust their caller: `choice.choose` asks `accepts` before a
model runs a path, and so do the device check (verify.py) and the self-check. Which path runs is
policy (choice.py); what a path is, is here. A new path is a module with its kernel and a row below.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from models.attention import cpu_flash, fused, launches, pallas
from models.attention.blockwise import blockwise_call
from models.attention.call import Call, CallSpec
from models.attention.dense import dense_call
from models.attention.fused import fused_attention
from models.attention.lambda_mask import lambda_dense_attention
from models.attention.triangular import triangular_attention
from posenc import Traits

__all__ = ["PATHS", "AttentionPath", "Call", "CallSpec"]


def _never() -> bool:
    return False


def _whole_rows(block: int) -> int | None:
    return None


@dataclasses.dataclass(frozen=True)
class AttentionPath:
    """One attention implementation.

    - run(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, call) -> out_BxTxHxK: the path, its variants chosen inside.
    - accepts(traits, spec) -> None | str: None where it can run the call, else why not (one line).
    - label: what it is, in words (the device check's reports).
    - xla: XLA's own code on every backend (the self-check judges every row against these).
    - baseline: one of XLA's paths at training lengths, which the device check holds a kernel to.
    - checked(): whether on this backend it runs a kernel outside XLA's own code (the Pallas kernel
      compiled, cuDNN's) that must pass the device check (verify.py) before use.
    - tile(block): the key-tile width it runs with at `model.attention_block` (None: whole rows),
      for the evaluation batch policy.
    - tuned: its launch configuration is searched per device (tuning.py) and given as `Call.launch`.
    - per_device: XLA has no rule to partition it, so training on several devices runs it per device.
    - grouped: `run` takes grouped-query keys and values as the layer projects them (kv_heads heads),
      not repeated for each query head.
    """
    run: Callable[..., jax.Array]
    accepts: Callable[[Traits, CallSpec], str | None]
    label: str
    xla: bool = False
    baseline: bool = False
    checked: Callable[[], bool] = _never
    tile: Callable[[int], int | None] = _whole_rows
    tuned: bool = False
    per_device: bool = False
    grouped: bool = False

    def refuse(self, traits: Traits, spec: CallSpec) -> None:
        """Raise the path's refusal (ValueError), if it has one."""
        refusal = self.accepts(traits, spec)
        if refusal:
            raise ValueError(refusal)


# ---- the sentences several paths share -----------------------------------------------------------

MASK_OPTIONS = "model.attention_sinks / model.attention_window"


def without_dropout(path: str) -> str:
    return (f"model.attention={path} does not implement attention dropout; set --config.model.attention=dense "
            f"(or auto) for training with it")


def masked_dropout(spec: CallSpec) -> str | None:
    if spec.masked and spec.dropping:
        return (f"the Lambda mask ({MASK_OPTIONS}) is an evaluation option and does not implement attention "
                f"dropout; leave both at 0 for training")
    return None


def without_mask(path: str, spec: CallSpec) -> str | None:
    """The refusal of a path that cannot apply the Lambda mask, where it is on."""
    if not spec.masked:
        return None
    return masked_dropout(spec) or (f"model.attention={path} cannot apply the Lambda mask ({MASK_OPTIONS}); set "
                                    f"--config.model.attention=dense, blockwise or auto")


def under_mask(traits: Traits, spec: CallSpec) -> str | None:
    """The refusal of a path that applies the Lambda mask, where it is on: a scheme whose weights are
    not a softmax, or whose bias needs whole rows, has no window to cut."""
    refusal = masked_dropout(spec)
    if refusal is None and spec.masked and (traits.needs_full_rows or traits.normalization != "softmax"):
        refusal = (f"positional scheme {spec.scheme!r} needs whole rows of keys or is not a softmax; the Lambda "
                   f"mask ({MASK_OPTIONS}) cannot apply to it: leave both at 0")
    return refusal


def _rows_of_tiles(traits: Traits) -> bool:
    """A rotation and / or an additive bias with at most a per-query logit scale, under a softmax:
    what can be computed from independent tiles of logits."""
    return not (traits.needs_full_rows or traits.transforms_logits or traits.normalization != "softmax"
                or traits.value_term or traits.logit_scale == "per_pair")


# ---- the rows ----------------------------------------------------------------------------------------

def dense_accepts(traits: Traits, spec: CallSpec) -> str | None:
    """Every scheme; under the Lambda mask, softmax schemes of tile biases; stick-breaking without dropout."""
    refusal = under_mask(traits, spec)
    if refusal is None and spec.dropping and traits.normalization == "stickbreaking":
        refusal = (f"positional scheme {spec.scheme!r} (stick-breaking attention) does not implement attention "
                   f"dropout; set --config.model.attention_dropout=0")
    return refusal


def dense_run(q, k, v, call: Call) -> jax.Array:
    if call.mask is not None:
        return lambda_dense_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.mask, call.context)
    causal_TxS = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), dtype=bool))
    return dense_call(q, k, v, call, causal_TxS)


def triangular_accepts(traits: Traits, spec: CallSpec) -> str | None:
    refusal = without_mask("triangular", spec)
    if refusal is None and not _rows_of_tiles(traits):
        refusal = (f"positional scheme {spec.scheme!r} adds a value term, scales logits per key, needs whole rows, "
                   f"transforms logits or is not a softmax; model.attention=triangular cannot express it: use "
                   f"dense or auto")
    return refusal


def triangular_run(q, k, v, call: Call) -> jax.Array:
    return triangular_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.dropout, call.context)


def blockwise_accepts(traits: Traits, spec: CallSpec) -> str | None:
    if spec.dropping:
        return without_dropout("blockwise")
    if traits.needs_whole_rows:
        return (f"positional scheme {spec.scheme!r} needs whole rows of keys for its bias and has no "
                f"carried_bias; set --config.model.attention=dense (or auto)")
    return under_mask(traits, spec)


def fused_accepts(traits: Traits, spec: CallSpec) -> str | None:
    """XLA's composite takes what its row expresses; on a GPU cuDNN's own limits too (fused.cudnn_refusal)."""
    if spec.dropping:
        return without_dropout("fused")
    refusal = without_mask("fused", spec)
    if refusal is None and not (_rows_of_tiles(traits) and traits.logit_scale == "none"):
        refusal = (f"positional scheme {spec.scheme!r} scales or transforms logits, adds a value term, needs whole "
                   f"rows or is not a softmax; model.attention=fused cannot express it: use dense or blockwise")
    if refusal is None and fused.implementation() == "cudnn":
        refusal = fused.cudnn_refusal(spec.dtype, spec.head_dim, spec.length, spec.training)
    return refusal


def fused_run(q, k, v, call: Call) -> jax.Array:
    return fused_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.context)


def pallas_accepts(traits: Traits, spec: CallSpec) -> str | None:
    """The schemes the kernel expresses; compiled (on a GPU), the head sizes and dtypes whose tiles
    Triton takes and the device's shared memory holds (launches.refusal)."""
    refusal = without_mask("pallas", spec)
    if refusal is None and not (_rows_of_tiles(traits) and not traits.reads_input
                                and traits.bias in ("none", "function")):
        refusal = (f"positional scheme {spec.scheme!r} adds a value term, scales logits per key, needs whole rows, "
                   f"has a bias without `bias_fn` or from the layer's input, transforms logits or is not a "
                   f"softmax; model.attention=pallas cannot express it: use auto, dense or triangular")
    if refusal is None and not pallas.interpreted():
        why = launches.refusal(spec.head_dim, spec.dtype, launches.shared_memory_limit())
        refusal = f"model.attention=pallas: {why}" if why else None
    return refusal


def pallas_run(q, k, v, call: Call) -> jax.Array:
    launch = call.launch if call.launch is not None else pallas.Launch()
    return pallas.pallas_attention(q, k, v, call.q_pos, call.k_pos, call.scheme, call.dropout, launch)


def cpu_flash_accepts(traits: Traits, spec: CallSpec) -> str | None:
    """Logits q . k alone (a rotation, a per-query scale; or q . k at positions a rotation moves:
    Self-Extend, DCA, ReRoPE, unwrapped), softmax, float32, no dropout, causal with or
    without a sliding window (the Lambda mask without sinks), on the CPU with the kernel built."""
    if spec.dropping:
        return without_dropout("cpu_flash")
    if spec.masked and spec.sinks:
        return (f"model.attention=cpu_flash applies a sliding window but not LM-Infinite's sinks "
                f"({MASK_OPTIONS}); use blockwise or auto")
    refusal = masked_dropout(spec) or under_mask(traits, spec)
    moved = traits.moves_positions and not traits.wrapper  # logits at moved positions: variants of q and k
    if refusal is None and not (_rows_of_tiles(traits) and (traits.bias == "none" or moved)
                                and not traits.reads_input):
        refusal = (f"positional scheme {spec.scheme!r} adds a bias, a value term, or scales logits per key; "
                   f"model.attention=cpu_flash computes q . k alone (or at positions a rotation moves): use "
                   f"auto, blockwise or dense")
    if refusal is None and spec.dtype != "float32":
        refusal = (f"model.attention=cpu_flash computes in float32; the model computes in {spec.dtype}: set "
                   f"--config.model.dtype=float32, or use auto")
    return refusal or cpu_flash.backend_refusal()


PATHS: dict[str, AttentionPath] = {
    "dense": AttentionPath(dense_run, dense_accepts, "dense attention (model.attention=dense)", xla=True,
                           baseline=True),
    "triangular": AttentionPath(triangular_run, triangular_accepts,
                                "triangular attention (model.attention=triangular)", xla=True, baseline=True),
    "blockwise": AttentionPath(blockwise_call, blockwise_accepts,
                               "blockwise attention (model.attention=blockwise)", xla=True, tile=lambda block: block),
    "fused": AttentionPath(fused_run, fused_accepts, "jax.nn.dot_product_attention (model.attention=fused)",
                           checked=lambda: fused.implementation() == "cudnn"),
    "pallas": AttentionPath(pallas_run, pallas_accepts, "the Pallas kernel", checked=lambda: not pallas.interpreted(),
                            tile=lambda block: pallas.BLOCK, tuned=True, per_device=True),
    "cpu_flash": AttentionPath(cpu_flash.cpu_flash_call, cpu_flash_accepts, "the CPU flash-attention kernel "
                               "(model.attention=cpu_flash)", tile=lambda block: block, grouped=True),
}
