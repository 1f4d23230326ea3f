"""Long evaluation in bounded memory for the schemes whose attention is not only a positional bias
(FoX's running sum, DAPE's MLP, stick-breaking's recurrence) and under LM-Infinite's mask: the
compiled evaluation program (XLA's buffer assignment, nothing run) grows linearly with the length."""
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.config import ModelConfig


def _peak_bytes(name: str, length: int, **model) -> int:
    cfg = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64, attention_block=128, **model)
    graphdef, params = nnx.split(DecoderLM(cfg, posenc.default_config(name), train_length=64, rngs=nnx.Rngs(0)))
    score = jax.jit(lambda params, tokens: nnx.merge(graphdef, params).token_nll(tokens, tokens).sum())
    memory = score.lower(params, jnp.zeros((1, length), jnp.int32)).compile().memory_analysis()
    return memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes


@pytest.mark.slow  # ~1 min: eight compilations at 2k and 4k tokens
@pytest.mark.parametrize("name,model", [("fox", {}), ("dape", {}), ("stickbreaking", {}),
                                        ("rope", {"attention_sinks": 4})], ids=["fox", "dape", "stickbreaking",
                                                                                "rope_lambda"])
def test_long_evaluation_memory_grows_linearly(name, model):
    short, long = _peak_bytes(name, 2048, **model), _peak_bytes(name, 4096, **model)
    assert long / short < 2.5, (short, long)  # a T x T matrix would make it 4
    dense = _peak_bytes(name, 4096, attention="dense", **model)
    assert dense > 3 * long  # what the tiles save
