"""The model a run's config describes, built whole or as shapes alone (for restoring a checkpoint
into it). Training, evaluation and init_from all build it here."""
from __future__ import annotations

from flax import nnx

from experiment.config import Config, typed
from models import DecoderLM
from models.decoder import build_model as build_decoder


def build_model(config, vocab_size: int, seed: int | None = None) -> DecoderLM:
    """The decoder of `config` (typed or a ConfigDict) for a vocabulary of `vocab_size`."""
    config = typed(config)
    return build_decoder(config.model_for(vocab_size), config.posenc, config.train.seq_len,
                         config.seed if seed is None else seed)


def abstract_model(config: Config, vocab_size: int) -> DecoderLM:
    """The model's shapes and dtypes only (nothing allocated)."""
    return nnx.eval_shape(lambda: build_model(config, vocab_size))
