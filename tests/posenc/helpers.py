"""Builders shared by several test files of tests/posenc. Each group of files builds its schemes at
the small dimensions its tests were written against, so each group has its own builder."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from models import DecoderLM
from models.attention.dense import tile_logits
from models.config import ModelConfig


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


# --- RoPE's options: test_rope_scaling, test_dual_chunk ----------------------------------------------
ROPE_TRAIN_LENGTH = 16


def rope_cfg(**options):
    cfg = posenc.default_config("rope")
    cfg.rope.update(options)
    return cfg


def build_rope(head_dim=16, heads=2, train_length=ROPE_TRAIN_LENGTH, **options):
    dims = posenc.ModelDims(d_model=head_dim * heads, num_heads=heads, head_dim=head_dim, num_layers=1,
                            train_length=train_length)
    return posenc.build(rope_cfg(**options), dims, rngs=nnx.Rngs(0))


def qk(t, s, heads=2, head_dim=16, seed=0, batch=1):
    kq, kk = jax.random.split(jax.random.key(seed))
    return (jax.random.normal(kq, (batch, t, heads, head_dim)),
            jax.random.normal(kk, (batch, s, heads, head_dim)))


def numpy_rope(x_TxHxK, positions_T, inv_freq, mscale=1.0):
    """HF's apply_rotary_pos_emb (rotate half) at explicit positions, float64; features beyond
    2 * len(inv_freq) pass unrotated (partial rotary)."""
    x = np.asarray(x_TxHxK, np.float64)
    r = 2 * len(inv_freq)
    angles = np.asarray(positions_T, np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None]
    emb = np.concatenate([angles, angles], -1)[:, None, :]
    cos, sin = np.cos(emb) * mscale, np.sin(emb) * mscale
    rot = x[..., :r]
    half = np.concatenate([-rot[..., r // 2:], rot[..., :r // 2]], -1)
    return np.concatenate([rot * cos + half * sin, x[..., r:]], -1)


def logits_through_hooks(scheme, q, k, pos):
    qr, kr = scheme.rotate(q, k, pos, pos)
    return tile_logits(qr, kr, pos, pos, scheme)


def rope_model(attention="dense", **options):
    cfg = ModelConfig(**{**CFG.__dict__, "attention": attention, "attention_block": 16})
    lm = DecoderLM(cfg, rope_cfg(**options), train_length=ROPE_TRAIN_LENGTH, rngs=nnx.Rngs(0))
    lm.compile_calls = True  # a call outside a trace: one program per shape, not one per operation
    return lm


def tokens(t, seed=0):
    return jax.random.randint(jax.random.key(seed), (2, t), 0, CFG.vocab_size)
