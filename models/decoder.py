"""A pre-LayerNorm decoder-only language model in Flax NNX.

Embedding (scaled by sqrt(d), as in fairseq) -> scheme.embed -> N x [LN -> causal attention ->
residual, LN -> MLP -> residual] -> LN -> tied output projection. The positional scheme is one
module shared by every layer unless it sets `per_layer = True` (one instance per layer). Which
attention implementation a call runs is decided in models/attention/choice.py.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import posenc
from models.adaptive import AdaptiveInput, AdaptiveSoftmax
from models.attention.blockwise import blockwise_attention
from models.attention.choice import DEFAULT_BLOCK, DEFAULT_PATH, PATHS, choose, is_long
from models.attention.dense import Dropout, dense_attention, fused_attention
from models.attention.pallas import pallas_attention
from models.attention.triangular import triangular_attention
from models.partitioning import columns_sharded, rows_sharded

ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape and options; `from_config(section, vocab_size)` builds and checks it
    from a config's `model` section.

    - vocabulary: `vocab_size` (0 until the tokenizer is known; `from_config` sets it).
    - shape: `num_layers`, `d_model`, `num_heads` (head size d_model / num_heads), `mlp_dim`,
      `activation`.
    - regularisation: three dropout rates, where `Block` and `Attention` say.
    - input and output layers: `tie_embeddings`, and adaptive input / softmax (`adaptive_*`,
      models/adaptive.py) for large word vocabularies.
    - attention implementation: `attention` (a path of models/attention/choice.py, or `auto`)
      and `attention_block`, the tile width of the long-sequence paths.
    - numerics: `dtype`, the compute dtype; parameters stay float32.
    """
    vocab_size: int = 0
    num_layers: int = 4
    d_model: int = 128
    num_heads: int = 4
    mlp_dim: int = 512
    activation: str = "gelu"
    dropout: float = 0.0            # on embeddings, attention output and MLP output
    attention_dropout: float = 0.0  # on attention probabilities
    activation_dropout: float = 0.0 # inside the MLP
    tie_embeddings: bool = True
    adaptive_cutoffs: tuple = ()    # e.g. (20000, 60000): adaptive input + adaptive softmax
    adaptive_factor: int = 4        # band i has width d_model / factor**i
    adaptive_tail_capacity: float = 0.25  # training scores a tail cluster in this fraction of each row's
                                    # positions (the tokens whose target it holds); a batch with a row
                                    # needing more scores it for every token. 0: every token always
    attention: str = DEFAULT_PATH   # auto | dense | triangular | blockwise | fused | pallas: how `auto`
                                    # chooses, and what each is, in models/attention/choice.py
    attention_block: int = DEFAULT_BLOCK  # tile size of blockwise attention (and of the MLP, evaluating long)
    dtype: str = "float32"          # compute dtype; parameters stay float32

    @classmethod
    def from_config(cls, model_cfg: Any, vocab_size: int) -> "ModelConfig":
        fields = {f.name for f in dataclasses.fields(cls)} - {"vocab_size"}
        given = dict(model_cfg)
        unknown = set(given) - fields
        if unknown:
            raise ValueError(f"unknown model option(s) {sorted(unknown)}; valid: {sorted(fields)}")
        if "adaptive_cutoffs" in given:
            given["adaptive_cutoffs"] = tuple(int(c) for c in given["adaptive_cutoffs"])
        cfg = cls(vocab_size=vocab_size, **given)
        if cfg.adaptive_cutoffs and cfg.adaptive_cutoffs[-1] >= vocab_size:
            raise ValueError(f"model.adaptive_cutoffs={cfg.adaptive_cutoffs} must lie below the vocabulary "
                             f"size {vocab_size}; lower them or use a larger vocabulary")
        if cfg.d_model % cfg.num_heads:
            raise ValueError(f"model.d_model={cfg.d_model} is not divisible by model.num_heads={cfg.num_heads}")
        if cfg.activation not in ACTIVATIONS:
            raise ValueError(f"unknown model.activation {cfg.activation!r}; valid: {sorted(ACTIVATIONS)}")
        if cfg.attention not in PATHS:
            raise ValueError(f"unknown model.attention {cfg.attention!r}; valid: {', '.join(PATHS)}")
        if cfg.dtype not in DTYPES:
            raise ValueError(f"unknown model.dtype {cfg.dtype!r}; valid: {sorted(DTYPES)}")
        return cfg


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; the identity when `key` is None (evaluation) or rate is 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def _split(key, n):
    return [None] * n if key is None else list(jax.random.split(key, n))


class Attention(nnx.Module):
    """Causal multi-head self-attention: one qkv projection, the positional scheme's hooks inside
    the attention function, an output projection. Each call asks models/attention/choice.py
    (`choose`) which implementation runs (`model.attention`, or for `auto`: the sequence length,
    whether attention dropout is on, what the scheme allows, the backend) and calls it. Attention
    dropout (`attention_dropout`, on the probabilities) applies only when a key is given."""

    def __init__(self, cfg: ModelConfig, scheme: posenc.Scheme, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.scheme = scheme
        self.head_dim = cfg.d_model // cfg.num_heads
        dtype = DTYPES[cfg.dtype]
        self.qkv = nnx.Linear(cfg.d_model, 3 * cfg.d_model, dtype=dtype, kernel_init=rows_sharded(), rngs=rngs)
        self.out = nnx.Linear(cfg.d_model, cfg.d_model, dtype=dtype, kernel_init=rows_sharded(), rngs=rngs)

    def __call__(self, x_BxTxD, positions_BxT, key=None):
        b, t, _ = x_BxTxD.shape
        qkv = self.qkv(x_BxTxD).reshape(b, t, 3, self.cfg.num_heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        drop = Dropout(self.cfg.attention_dropout, key)
        kind = choose(self.cfg, self.scheme, positions_BxT, q.dtype, dropping=drop.active)
        pos = positions_BxT
        if kind == "pallas":
            out = pallas_attention(q, k, v, pos, pos, self.scheme, drop)
        elif kind == "fused":
            out = fused_attention(q, k, v, pos, pos, self.scheme)
        elif kind == "triangular":
            out = triangular_attention(q, k, v, pos, pos, self.scheme, drop)
        elif kind == "blockwise":
            out = blockwise_attention(q, k, v, pos, pos, self.scheme, self.cfg.attention_block)
        else:
            mask_TxT = jnp.tril(jnp.ones((t, t), dtype=bool))
            out = dense_attention(q, k, v, pos, pos, self.scheme, mask_TxT, drop)
        return self.out(out.reshape(b, t, self.cfg.d_model))


class Block(nnx.Module):
    """One pre-LayerNorm decoder layer: x + drop(Attention(LN1(x))), then
    x + drop(fc2(drop_act(act(fc1(LN2(x)))))). `dropout` applies to the attention output and the MLP
    output before each residual addition, `activation_dropout` after the MLP's activation,
    `attention_dropout` inside Attention; all only with a key (training). Evaluating a long
    sequence (no key, `is_long` at `attention_block`), the MLP runs on `attention_block`
    positions at a time (`by_chunks`), so that no B x T x mlp_dim activation exists."""

    def __init__(self, cfg: ModelConfig, scheme: posenc.Scheme, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = DTYPES[cfg.dtype]
        self.ln1 = nnx.LayerNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        self.attn = Attention(cfg, scheme, rngs=rngs)
        self.ln2 = nnx.LayerNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        self.fc1 = nnx.Linear(cfg.d_model, cfg.mlp_dim, dtype=dtype, kernel_init=rows_sharded(), rngs=rngs)
        self.fc2 = nnx.Linear(cfg.mlp_dim, cfg.d_model, dtype=dtype, kernel_init=rows_sharded(), rngs=rngs)

    def __call__(self, x_BxTxD, positions_BxT, key=None):
        k_attn, k_res1, k_act, k_res2 = _split(key, 4)
        x_BxTxD = x_BxTxD + dropout(self.attn(self.ln1(x_BxTxD), positions_BxT, k_attn),
                                    self.cfg.dropout, k_res1)

        def mlp(x):
            h = dropout(ACTIVATIONS[self.cfg.activation](self.fc1(self.ln2(x))), self.cfg.activation_dropout, k_act)
            return dropout(self.fc2(h), self.cfg.dropout, k_res2)

        chunk = self.cfg.attention_block
        if key is None and is_long(x_BxTxD.shape[1], chunk):  # long evaluation: B x chunk x mlp_dim at a time
            return x_BxTxD + by_chunks(mlp, x_BxTxD, chunk)
        return x_BxTxD + mlp(x_BxTxD)


def by_chunks(fn, x_BxTxD: jax.Array, chunk: int) -> jax.Array:
    """`fn` (position-wise) applied to `chunk` positions at a time, so that its intermediates are
    O(chunk) rather than O(T); the last chunk is zero-padded."""
    b, t, d = x_BxTxD.shape
    n = -(-t // chunk)
    x = jnp.pad(x_BxTxD, ((0, 0), (0, n * chunk - t), (0, 0))).reshape(b, n, chunk, d)
    out = jax.lax.map(fn, jnp.moveaxis(x, 1, 0))
    return jnp.moveaxis(out, 0, 1).reshape(b, n * chunk, -1)[:, :t]


class DecoderLM(nnx.Module):
    """The language model: `model(tokens_BxT) -> logits_BxTxV`, `token_nll` for training and
    evaluation, `hidden` for the final hidden states.

    Built from a ModelConfig, the positional scheme's config (posenc; built here with the model's
    dimensions and `train_length`) and an `nnx.Rngs`; `build_model` does it from a seed.
    Positions default to 0 .. T-1 for every row (after the scheme's length check); a
    `dropout_key` means training: dropout on, and a scheme may draw other positions
    (`sample_positions`, e.g. randomized positions)."""

    def __init__(self, cfg: ModelConfig, posenc_cfg: Any, train_length: int, *, rngs: nnx.Rngs):
        # Sharding annotations are metadata only: experiment/runtime/sharding.py places the parameters.
        with nnx.use_eager_sharding(False):
            self._build(cfg, posenc_cfg, train_length, rngs)

    def _build(self, cfg: ModelConfig, posenc_cfg: Any, train_length: int, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = DTYPES[cfg.dtype]
        dims = posenc.ModelDims(d_model=cfg.d_model, num_heads=cfg.num_heads,
                                head_dim=cfg.d_model // cfg.num_heads, num_layers=cfg.num_layers,
                                train_length=train_length)
        self.scheme = posenc.build(posenc_cfg, dims, rngs=rngs)
        # Per-layer schemes get one instance per block (the first block's is also `self.scheme`, for
        # `embed`); read off the instance, since a wrapper decides by what it wraps.
        layer_schemes = [self.scheme] * cfg.num_layers
        if self.scheme.per_layer:
            layer_schemes = [self.scheme] + [posenc.build(posenc_cfg, dims, rngs=rngs)
                                             for _ in range(cfg.num_layers - 1)]
        if cfg.adaptive_cutoffs:
            self.embed = AdaptiveInput(cfg.vocab_size, cfg.d_model, cfg.adaptive_cutoffs,
                                       cfg.adaptive_factor, rngs=rngs, dtype=dtype)
            self.softmax = AdaptiveSoftmax(cfg.vocab_size, cfg.d_model, cfg.adaptive_cutoffs,
                                           cfg.adaptive_factor, rngs=rngs, dtype=dtype,
                                           tie_to=self.embed if cfg.tie_embeddings else None,
                                           tail_capacity=cfg.adaptive_tail_capacity)
        else:
            self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, rngs=rngs,
                                   embedding_init=columns_sharded(nnx.initializers.normal(stddev=cfg.d_model ** -0.5)))
        self.blocks = nnx.List([Block(cfg, scheme, rngs=rngs) for scheme in layer_schemes])
        self.ln_f = nnx.LayerNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        if not cfg.tie_embeddings and not cfg.adaptive_cutoffs:
            self.unembed = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False, dtype=dtype,
                                      kernel_init=rows_sharded(), rngs=rngs)

    def hidden(self, tokens_BxT: jax.Array, positions_BxT: jax.Array | None = None,
               dropout_key: jax.Array | None = None) -> jax.Array:
        """The final (normalised) hidden states, B x T x D."""
        b, t = tokens_BxT.shape
        if positions_BxT is None:
            self.scheme.check_length(t)
            positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if dropout_key is not None:  # training: a scheme may train on other positions (randomized)
            # fold_in(k, i) equals split(k, n)[i], so a constant far above the layer count is used.
            positions_BxT = self.scheme.sample_positions(positions_BxT,
                                                         jax.random.fold_in(dropout_key, 2**31 - 1))
        keys = _split(dropout_key, self.cfg.num_layers + 1)
        x = self.embed(tokens_BxT) * self.cfg.d_model ** 0.5
        x = dropout(self.scheme.embed(x, positions_BxT), self.cfg.dropout, keys[0])
        for block, key in zip(self.blocks, keys[1:]):
            x = block(x, positions_BxT, key)
        return self.ln_f(x)

    def __call__(self, tokens_BxT: jax.Array, positions_BxT: jax.Array | None = None,
                 dropout_key: jax.Array | None = None) -> jax.Array:
        """Logits over the vocabulary, B x T x V, float32 (log-probabilities with adaptive softmax)."""
        x = self.hidden(tokens_BxT, positions_BxT, dropout_key)
        if self.cfg.adaptive_cutoffs:
            return self.softmax.log_probs(x)
        if self.cfg.tie_embeddings:
            return self.embed.attend(x).astype(jnp.float32)
        return self.unembed(x).astype(jnp.float32)

    def token_nll(self, tokens_BxT: jax.Array, targets_BxT: jax.Array,
                  positions_BxT: jax.Array | None = None,
                  dropout_key: jax.Array | None = None) -> jax.Array:
        """Negative log-likelihood of each target, B x T, float32 (what training and evaluation use)."""
        if self.cfg.adaptive_cutoffs:
            return self.softmax.nll(self.hidden(tokens_BxT, positions_BxT, dropout_key), targets_BxT)
        logits = self(tokens_BxT, positions_BxT, dropout_key)
        log_z = jax.nn.logsumexp(logits, axis=-1)
        return log_z - jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[..., 0]


def build_model(model_cfg: ModelConfig, posenc_cfg: Any, train_length: int, seed: int) -> DecoderLM:
    """A DecoderLM with its parameters initialised from `seed` (nnx.Rngs(seed))."""
    return DecoderLM(model_cfg, posenc_cfg, train_length, rngs=nnx.Rngs(seed))
