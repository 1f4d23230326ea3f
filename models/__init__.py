"""Models: the decoder LM (decoder.py), its config (config.py, free of JAX), its attention
(attention/) and checkpoint formats (hf.py). Importing the package loads no JAX: the names below
are imported from their modules on first use."""
import importlib

from models.config import ModelConfig

_LAZY = {"DecoderLM": "models.decoder", "build_model": "models.decoder",
         "dense_attention": "models.attention.dense", "blockwise_attention": "models.attention.blockwise",
         "triangular_attention": "models.attention.triangular"}

__all__ = ["DecoderLM", "ModelConfig", "build_model", "dense_attention", "blockwise_attention",
           "triangular_attention"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
