"""Causal self-attention that calls the positional scheme's hooks, in five implementations (dense,
triangular, blockwise, fused, pallas), one row each in the table of paths.py (how to run it, which
calls it refuses); choice.py decides which one runs, statistics.py measures where attention looks.
NEG_INF and the hooks' tile logits are in tiles.py (re-exported by dense.py), for every path;
stickbreaking.py holds the stick-breaking weights and lambda_mask.py LM-Infinite's Lambda mask,
which the dense and blockwise paths apply. The names below are imported from their modules on first
use, so that importing one module of the package loads no other path."""
from posenc.lazy import lazy_attributes

_LAZY = {"blockwise_attention": "blockwise",
         "attention_path": "choice", "choose": "choice", "is_long": "choice", "runs_per_device": "choice",
         "tile_width": "choice",
         "NEG_INF": "dense", "Dropout": "dense", "dense_attention": "dense", "tile_logits": "dense",
         "fused_attention": "fused",
         "LambdaMask": "lambda_mask", "lambda_dense_attention": "lambda_mask",
         "pallas_attention": "pallas",
         "PATHS": "paths", "Call": "paths", "Path": "paths", "Shape": "paths",
         "attention_statistics": "statistics", "layer_statistics": "statistics", "qk_statistics": "statistics",
         "triangular_attention": "triangular"}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, {name: f".{module}" for name, module in _LAZY.items()})
