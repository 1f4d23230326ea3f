"""Which attention implementation runs: the one place that decides.

`model.attention` names a path or leaves the choice to `auto`:

  dense       dense.py: one T x T matrix, every scheme, dropout included
  triangular  triangular.py: the row tiles on and below the diagonal, a hand-written backward pass
  blockwise   blockwise.py: tile by tile with an online softmax, O(T * block) memory, no dropout
  fused       dense.py: `jax.nn.dot_product_attention` (cuDNN on GPU), no dropout
  pallas      pallas.py: a flash-attention kernel (compiled on GPU, interpreted elsewhere)

`auto` takes the Pallas kernel on GPU for a scheme it expresses; else blockwise for long sequences
unless attention dropout is on or the scheme needs whole rows; else triangular where the scheme
allows it and its bias does no work per key; else dense. The decoder (`Attention.__call__`:
`choose`), the evaluation batch policy (`tile_width`) and training on several devices
(`runs_per_device`) all ask here.

`tile_width` and `runs_per_device` take a model config as a `ModelConfig` or as a config section
(ConfigDict / dict, where a run saved before an option existed lacks it: the default applies).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from models.attention import pallas
from models.attention.blockwise import needs_whole_rows
from models.attention.triangular import supports as triangular_supports
from posenc import Scheme

PATHS = ("auto", "dense", "triangular", "blockwise", "fused", "pallas")
DEFAULT_PATH = "auto"
DEFAULT_BLOCK = 512  # tile width of blockwise attention (and of the MLP, evaluating long)
NO_DROPOUT_PATHS = ("fused", "blockwise")


def is_long(length: int, block: int) -> bool:
    """Sequences this long are evaluated tile by tile (attention) and chunk by chunk (the MLP)."""
    return length > 2 * block


def attention_path(kind: str, block: int, scheme: Scheme | type[Scheme], length: int, *,
                   dropping: bool = False, triangular: bool = False, pallas: bool = False) -> str:
    """The attention implementation for one sequence length: `kind` ('auto' or an explicit
    model.attention) resolved to 'dense' | 'triangular' | 'blockwise' | 'fused' | 'pallas'. 'auto'
    takes the Pallas kernel where `pallas` (on GPU, for a scheme it expresses: any length, dropout
    included), else blockwise for long sequences (`is_long`) unless attention dropout is on or the
    scheme needs whole rows; otherwise the triangular path where `triangular` (it supports the
    scheme and the scheme does no per-key work), else dense."""
    if kind != "auto":
        return kind
    if pallas:
        return "pallas"
    if is_long(length, block) and not dropping and not needs_whole_rows(scheme):
        return "blockwise"
    if triangular and not scheme.bias_work_per_key:
        return "triangular"
    return "dense"


def choose(cfg: Any, scheme: Scheme, positions_BxT: jax.Array, dtype, *, dropping: bool) -> str:
    """The path of one `Attention` call on `positions_BxT` (self-attention, compute dtype `dtype`):
    for `auto`, whether the triangular path and the Pallas kernel can take the scheme (probed at
    trace time), then `attention_path`. An explicit path that cannot drop out attention
    probabilities while `dropping` raises."""
    auto, window = cfg.attention == "auto", _setting(cfg, "attention_window", 0)
    kind = attention_path(cfg.attention, cfg.attention_block, scheme, positions_BxT.shape[1],
                          dropping=dropping,
                          triangular=auto and triangular_supports(scheme, positions_BxT, positions_BxT),
                          pallas=auto and not window and not pallas.interpreted()
                          and pallas.supports(scheme, positions_BxT, positions_BxT)
                          and pallas.available(scheme, dtype))
    if kind == "pallas" and window:
        raise ValueError("model.attention=pallas has no sliding window (model.attention_window); use auto, "
                         "dense, triangular, blockwise or fused")
    if dropping and kind in NO_DROPOUT_PATHS:
        raise ValueError(f"model.attention={kind} does not implement attention dropout; "
                         f"set --config.model.attention=dense (or auto) for training with it")
    return kind


def _setting(model_cfg: Any, name: str, default):
    """One option of a ModelConfig or of a config section (its default where the section lacks it)."""
    get = getattr(model_cfg, "get", None)
    return get(name, default) if get is not None else getattr(model_cfg, name)


def tile_width(model_cfg: Any, scheme_cls: Scheme | type[Scheme], length: int) -> int | None:
    """The key-tile width attention will use at this length (None: dense, full rows), for the
    evaluation batch policy, before any model exists: `attention_path` without the trace-time
    probes (so `auto` resolves to blockwise or dense here)."""
    block = _setting(model_cfg, "attention_block", DEFAULT_BLOCK)
    path = attention_path(_setting(model_cfg, "attention", DEFAULT_PATH), block, scheme_cls, length)
    if path == "pallas":
        return pallas.BLOCK
    return block if path == "blockwise" else None


def runs_per_device(model_cfg: Any, scheme: Scheme, devices: int) -> bool:
    """Whether training on `devices` devices runs its forward and backward pass per device
    (experiment/train/step.py, make_train_step's `per_device_mesh`): where the Pallas attention kernel
    runs compiled (GPU), which has no rule for XLA to partition it, explicitly
    (model.attention=pallas) or as `auto`'s choice."""
    if devices < 2 or pallas.interpreted():
        return False
    kind, positions = _setting(model_cfg, "attention", DEFAULT_PATH), jnp.zeros((1, 1), jnp.int32)
    windowed = bool(_setting(model_cfg, "attention_window", 0))
    return kind == "pallas" or (kind == "auto" and not windowed and pallas.supports(scheme, positions, positions))
