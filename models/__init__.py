"""Models: the decoder LM and its attention."""
from models.attention import blockwise_attention, dense_attention
from models.decoder import DecoderLM, ModelConfig

__all__ = ["DecoderLM", "ModelConfig", "dense_attention", "blockwise_attention"]
