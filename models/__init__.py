"""Models: the decoder LM and its attention."""
from models.attention import blockwise_attention, dense_attention, triangular_attention
from models.decoder import DecoderLM, ModelConfig, build_model

__all__ = ["DecoderLM", "ModelConfig", "build_model", "dense_attention", "blockwise_attention",
           "triangular_attention"]
