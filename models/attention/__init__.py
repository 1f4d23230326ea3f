"""Causal self-attention that calls the positional scheme's hooks, in five implementations (dense,
triangular, blockwise, fused, pallas), one row each in the table of paths.py (how to run it, which
calls it refuses, from the call's description in call.py); choice.py decides which one runs;
verify.py checks a kernel on the device (verdicts.py keeps its verdicts), tuning.py searches the
Pallas kernel's launch (launches.py: what fits the device) and races it; statistics.py measures
where attention looks.
NEG_INF and the hooks' tile logits are in tiles.py (re-exported by dense.py), for every path;
stickbreaking.py holds the stick-breaking weights and lambda_mask.py LM-Infinite's Lambda mask,
which the dense and blockwise paths apply. The names below are imported from their modules on first
use, so that importing one module of the package loads no other path."""
from posenc.lazy import lazy_attributes

_LAZY = {"blockwise_attention": "blockwise", "blockwise_call": "blockwise",
         "Call": "call", "CallSpec": "call", "Dropout": "call",
         "attention_path": "choice", "choose": "choice", "is_long": "choice", "runs_per_device": "choice",
         "tile_width": "choice", "training_calls": "choice",
         "NEG_INF": "dense", "dense_attention": "dense", "dense_call": "dense", "tile_logits": "dense",
         "fused_attention": "fused",
         "LambdaMask": "lambda_mask", "lambda_dense_attention": "lambda_mask",
         "pallas_attention": "pallas",
         "PATHS": "paths", "AttentionPath": "paths",
         "attention_statistics": "statistics", "layer_statistics": "statistics", "qk_statistics": "statistics",
         "triangular_attention": "triangular"}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, {name: f".{module}" for name, module in _LAZY.items()})
