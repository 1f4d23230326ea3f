"""Models: the decoder LM and its attention."""
from models.attention import blockwise_attention, dense_attention
from models.decoder import DecoderLM, ModelConfig
from models.triangular import triangular_attention

__all__ = ["DecoderLM", "ModelConfig", "dense_attention", "blockwise_attention", "triangular_attention"]
