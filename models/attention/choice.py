"""Which attention implementation runs: the one place that decides.

`model.attention` names a path or leaves the choice to `auto`:

  dense       dense.py: one T x T matrix, every scheme, dropout included
  triangular  triangular.py: the row tiles on and below the diagonal, a hand-written backward pass
  blockwise   blockwise.py: tile by tile with an online softmax, O(T * block) memory, no dropout
  fused       dense.py: `jax.nn.dot_product_attention` (cuDNN on GPU), no dropout
  pallas      pallas.py: a flash-attention kernel (compiled on GPU, interpreted elsewhere)

`auto` takes the Pallas kernel on GPU for a scheme it expresses, once the kernel has passed its
numerical check on the device (verify.py, with the launch configuration tuning.py chose; a failure
is printed in one line and XLA's paths are kept); else blockwise for long sequences unless attention
dropout is on or the scheme needs whole rows; else triangular where the scheme allows it and its
bias does no work per key; else dense. An explicit `pallas` (on GPU) or `fused` (on GPU) runs the
same check and refuses a kernel that fails it, unless `model.attention_check` is off (for
benchmarking). Under LM-Infinite's Lambda mask (`model.attention_sinks` / `attention_window`) only dense and
blockwise apply. The decoder (`Attention.__call__`: `choose`), the evaluation batch policy
(`tile_width`) and training on several devices (`runs_per_device`) all ask here.

`tile_width` and `runs_per_device` take a model config as a `ModelConfig` or as a config section
(ConfigDict / dict, where a run saved before an option existed lacks it: the default applies).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from models.attention import pallas, tuning, verify
from models.attention.blockwise import needs_whole_rows
from models.attention.triangular import supports as triangular_supports
from models.config import ATTENTION_PATHS as PATHS, DEFAULT_BLOCK, DEFAULT_PATH  # noqa: F401  (PATHS: re-exported)
from posenc import Scheme

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
    if triangular and not scheme.traits.bias_work_per_key:
        return "triangular"
    return "dense"


def lambda_masked(model_cfg: Any) -> bool:
    """Whether LM-Infinite's Lambda mask is on (`model.attention_sinks` or `attention_window` set;
    models/attention/lambda_mask.py), which only the dense and blockwise paths apply."""
    return bool(_setting(model_cfg, "attention_sinks", 0) or _setting(model_cfg, "attention_window", 0))


def choose(cfg: Any, scheme: Scheme, positions_BxT: jax.Array, dtype, *, dropping: bool) -> str:
    """The path of one `Attention` call on `positions_BxT` (self-attention, compute dtype `dtype`):
    for `auto`, whether the triangular path and the Pallas kernel can take the scheme (decided at
    trace time; the kernel's check runs then, once; neither under the Lambda mask), then
    `attention_path`. An explicit path that cannot drop out attention probabilities while
    `dropping`, or cannot apply the Lambda mask, raises, and so does an explicit fused kernel that
    fails its check here (`model.attention_check`)."""
    auto, masked = cfg.attention == "auto", lambda_masked(cfg)
    kind = attention_path(cfg.attention, cfg.attention_block, scheme, positions_BxT.shape[1],
                          dropping=dropping,
                          triangular=auto and not masked and triangular_supports(scheme, positions_BxT, positions_BxT),
                          pallas=auto and not masked and kernel_usable(scheme, positions_BxT, dtype, dropping))
    if dropping and kind in NO_DROPOUT_PATHS:
        raise ValueError(f"model.attention={kind} does not implement attention dropout; "
                         f"set --config.model.attention=dense (or auto) for training with it")
    if masked and dropping:
        raise ValueError("the Lambda mask (model.attention_sinks / model.attention_window) is an evaluation option "
                         "and does not implement attention dropout; leave both at 0 for training")
    if masked and kind not in ("dense", "blockwise"):
        raise ValueError(f"model.attention={kind} cannot apply the Lambda mask (model.attention_sinks / "
                         f"model.attention_window); set --config.model.attention=dense, blockwise or auto")
    if not auto and checked_here(kind) and _setting(cfg, "attention_check", True):
        verdict = device_verdict(kind, scheme, dtype, dropping)
        if not verdict.ok:
            raise ValueError(f"model.attention={kind}: {verdict.reason}. Use model.attention=auto (XLA's "
                             f"paths where the kernel fails) or dense; model.attention_check=False runs it "
                             f"unchecked (for benchmarking only)")
    return kind


def checked_here(kind: str) -> bool:
    """Whether `kind` runs a kernel here that the device check guards: the Pallas kernel where it is
    compiled (GPU), and `fused` on GPU (cuDNN); elsewhere both are XLA's or the interpreter's."""
    if kind == "pallas":
        return not pallas.interpreted()
    return kind == "fused" and jax.default_backend() == "gpu"


def device_verdict(kind: str, scheme: Scheme, dtype, dropping: bool = False) -> verify.Verdict:
    """The device check's verdict on the kernel of `kind` for this scheme and dtype, with attention
    dropout where `dropping` (cached)."""
    if kind == "pallas":
        return tuning.kernel_verdict(scheme, dtype, dropout=dropping)
    return verify.verified(kind, scheme, dtype)


_SAID: set = set()


def kernel_usable(scheme: Scheme, positions_BxT: jax.Array, dtype, dropping: bool = False) -> bool:
    """Whether `auto` may take the Pallas kernel: compiled here (GPU) for a scheme it expresses, on
    one device or per device (inside `shard_map`, as training runs there: `runs_per_device`; the
    kernel has no partitioning rule, so XLA would gather a sharded batch onto every device), and
    passing its check on this device (with attention dropout where `dropping`). A kernel that fails
    is said once, in one line."""
    if pallas.interpreted() or (jax.device_count() > 1 and not pallas.per_device()):
        return False
    if not pallas.supports(scheme, positions_BxT, positions_BxT):
        return False
    verdict = tuning.kernel_verdict(scheme, dtype, dropout=dropping)
    if not verdict.ok and verdict.reason not in _SAID:
        _SAID.add(verdict.reason)
        print(f"model.attention=auto: {verdict.reason}; using XLA's attention paths")
    return verdict.ok


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
    (model.attention=pallas) or as `auto`'s choice (a scheme it expresses, the kernel passing its
    check on this device)."""
    if devices < 2 or pallas.interpreted():
        return False
    kind, positions = _setting(model_cfg, "attention", DEFAULT_PATH), jnp.zeros((1, 1), jnp.int32)
    if kind != "auto":
        return kind == "pallas"
    dtype = _setting(model_cfg, "dtype", "float32")  # the check runs here, before the step is traced
    dropout = _setting(model_cfg, "attention_dropout", 0.0) > 0
    return pallas.supports(scheme, positions, positions) and tuning.kernel_verdict(scheme, dtype, dropout).ok
