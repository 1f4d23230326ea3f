"""Builders shared by several test files of tests/posenc. Each group of files builds its schemes at
the small dimensions its tests were written against, so each group has its own builder."""
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from models import ModelConfig


# --- absolute embeddings: test_naive, test_multiplicative, test_hierarchical -----------------------
def build_embedding(name, d_model=16, train_length=5, **options):
    cfg = posenc.default_config(name)
    if options:
        cfg[name].update(options)
    dims = posenc.ModelDims(d_model=d_model, num_heads=2, head_dim=d_model // 2, num_layers=1,
                            train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def embed_zeros(scheme, positions, d_model=16):
    positions = jnp.asarray(positions)[None]
    return np.asarray(scheme.embed(jnp.zeros((1, positions.shape[1], d_model)), positions))[0]


# --- learned biases: test_kerple, test_sandwich, test_fire -----------------------------------------
POS = jnp.arange(8)[None]


def build_bias(name, heads=2, train_length=16, **options):
    cfg = posenc.default_config(name)
    if options:
        cfg[name].update(options)
    dims = posenc.ModelDims(d_model=8 * heads, num_heads=heads, head_dim=8, num_layers=1,
                            train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def set_param(param, value):
    param[...] = jnp.asarray(value, jnp.float32)


# --- options of any block (`block__field`): test_conv, test_complex_order, test_floater, test_cope,
# test_wrappers ---------------------------------------------------------------------------------------
DIMS = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_length=16)
CFG = ModelConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=4, mlp_dim=64)


def build_with(name, dims=DIMS, **options):
    cfg = posenc.default_config(name)
    for key, value in options.items():
        block, field = key.split("__")
        cfg[block][field] = value
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def positions(b, t, start=0):
    return jnp.broadcast_to(jnp.arange(start, start + t, dtype=jnp.int32), (b, t))
