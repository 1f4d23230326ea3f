"""Models: the decoder LM (decoder.py), its config (config.py, free of JAX), its attention
(attention/) and checkpoint formats (hf.py). Importing the package loads no JAX: the names below
are imported from their modules on first use."""
from models.config import ModelConfig
from posenc.lazy import lazy_attributes

_LAZY = {"DecoderLM": "models.decoder", "build_model": "models.decoder",
         "dense_attention": "models.attention.dense", "blockwise_attention": "models.attention.blockwise",
         "triangular_attention": "models.attention.triangular"}

__all__ = ["DecoderLM", "ModelConfig", "build_model", "dense_attention", "blockwise_attention",
           "triangular_attention"]

__getattr__ = lazy_attributes(__name__, _LAZY)
