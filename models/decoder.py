"""A pre-LayerNorm decoder-only language model in Flax NNX.

Embedding (scaled by sqrt(d), as in fairseq) -> scheme.embed -> N x [LN -> causal attention ->
residual, LN -> MLP -> residual] -> LN -> tied output projection. The positional scheme is one
module shared by every layer unless its traits say `per_layer` (one instance per layer). Which
attention path a call runs is decided in models/attention/choice.py, from the table of paths in
models/attention/paths.py.

ModelConfig (models/config.py, free of JAX) also gives the Llama family's block (RMSNorm, SwiGLU,
grouped-query attention, no biases, unscaled embeddings), GPT-NeoX's (parallel residual) and Gemma 3's
(q / k norms, norms after each branch, windowed layers with a global one every N at their own RoPE
base); models/hf.py loads Hugging Face checkpoints into them.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import posenc
from models import compiled
from models.adaptive import AdaptiveInput, AdaptiveSoftmax
from models.attention.choice import choose, is_long, launch
from models.attention.dense import Dropout
from models.attention.lambda_mask import lambda_mask
from models.attention.paths import PATHS, Call
from models.attention.tiles import map_after
from models.config import ModelConfig
from models.partitioning import columns_sharded, rows_sharded

# What models/config.py's names mean in JAX (tests/models/test_config.py: the same keys).
# "gelu" is the tanh approximation (HF's gelu_new / gelu_pytorch_tanh), "gelu_exact" the erf form (HF's gelu)
ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
               "silu": jax.nn.silu}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; the identity when `key` is None (evaluation) or rate is 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def _split(key, n):
    return [None] * n if key is None else list(jax.random.split(key, n))


def norm_layer(cfg: ModelConfig, rngs: nnx.Rngs, features: int | None = None) -> nnx.Module:
    """The norm `cfg.norm` names: LayerNorm (with or without bias) or RMSNorm, epsilon `norm_eps`,
    over `features` (default d_model)."""
    features = features or cfg.d_model
    if cfg.norm == "rmsnorm":
        return nnx.RMSNorm(features, epsilon=cfg.norm_eps, dtype=DTYPES[cfg.dtype], rngs=rngs)
    return nnx.LayerNorm(features, epsilon=cfg.norm_eps, use_bias=cfg.norm == "layernorm",
                         dtype=DTYPES[cfg.dtype], rngs=rngs)


def linear(cfg: ModelConfig, d_in: int, d_out: int, use_bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
    """A projection of the decoder: compute dtype of `cfg`, input rows annotated for FSDP."""
    return nnx.Linear(d_in, d_out, use_bias=use_bias, dtype=DTYPES[cfg.dtype], kernel_init=rows_sharded(),
                      rngs=rngs)


class Attention(nnx.Module):
    """Causal multi-head self-attention: one qkv projection (the q features of every head, then
    k's, then v's; with grouped-query attention k and v have `kv_heads` heads, repeated to serve
    their groups of query heads, as Hugging Face's repeat_kv), the positional scheme's hooks inside
    the attention function, an output projection. Each call asks models/attention/choice.py
    (`choose`) which path runs (`model.attention`, or for `auto`: the sequence length, whether
    attention dropout is on, what the scheme allows, the backend) and runs its row of
    models/attention/paths.py, with the scheme's `token_context` of the layer's input (FoX) and
    LM-Infinite's Lambda mask where the config sets one. Attention dropout (`attention_dropout`, on
    the probabilities) applies only when a key is given."""

    def __init__(self, cfg: ModelConfig, scheme: posenc.Scheme, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.scheme = scheme
        self.head_dim = cfg.head_size
        width = (cfg.num_heads + 2 * cfg.kv_heads) * self.head_dim
        self.qkv = linear(cfg, cfg.d_model, width, cfg.qkv_bias, rngs)
        self.out = linear(cfg, cfg.num_heads * self.head_dim, cfg.d_model, cfg.out_bias, rngs)
        if cfg.qk_norm:  # over each head's features (Gemma 3), before the positional scheme
            self.q_norm = norm_layer(cfg, rngs, self.head_dim)
            self.k_norm = norm_layer(cfg, rngs, self.head_dim)

    kv = None  # generation's LayerCache of this layer, on its copy of the model (models/generate.py)

    def project_grouped(self, x_BxTxD):
        """q (B x T x num_heads x head_dim), k and v (B x T x kv_heads x head_dim); q and k normed
        per head where `qk_norm`."""
        b, t, _ = x_BxTxD.shape
        h, kv = self.cfg.num_heads, self.cfg.kv_heads
        qkv = self.qkv(x_BxTxD).reshape(b, t, h + 2 * kv, self.head_dim)
        q, k, v = qkv[:, :, :h], qkv[:, :, h:h + kv], qkv[:, :, h + kv:]
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def project(self, x_BxTxD):
        """q, k, v, each B x T x num_heads x head_dim (k and v repeated under grouped-query attention,
        as Hugging Face's repeat_kv)."""
        return self._repeated(*self.project_grouped(x_BxTxD))

    def _repeated(self, q, k, v):
        h, kv = self.cfg.num_heads, self.cfg.kv_heads
        if kv != h:
            k, v = jnp.repeat(k, h // kv, axis=2), jnp.repeat(v, h // kv, axis=2)
        return q, k, v

    def __call__(self, x_BxTxD, positions_BxT, key=None):
        b, t, _ = x_BxTxD.shape
        q, k, v = self.project_grouped(x_BxTxD)
        if self.kv is not None:  # generating (models/generation/attend.py)
            from models.generation import attend
            if t == 1:  # a decoding step: one new token per row against the cache
                out = attend.decode(self.kv, self.scheme, q, k, v, positions_BxT)
                return self.out(out.reshape(b, t, self.cfg.num_heads * self.head_dim))
            attend.prefill(self.kv, self.scheme, q, k, v, positions_BxT)  # a prompt: its path as usual, cached
        drop = Dropout(self.cfg.attention_dropout, key)
        kind = choose(self.cfg, self.scheme, positions_BxT, q.dtype, dropping=drop.active)
        if not PATHS[kind].grouped:  # a path that takes grouped-query keys and values reads them in place
            q, k, v = self._repeated(q, k, v)
        call = Call(positions_BxT, positions_BxT, self.scheme, drop,
                    context=self.scheme.token_context(x_BxTxD, positions_BxT),  # None unless it reads its input (FoX)
                    mask=lambda_mask(self.cfg, self.scheme.dims.train_length),  # None unless LM-Infinite's is on
                    block=self.cfg.attention_block,
                    launch=launch(kind, self.scheme, q.dtype, self.cfg, positions_BxT, drop.active))
        out = PATHS[kind].run(q, k, v, call)
        return self.out(out.reshape(b, t, self.cfg.num_heads * self.head_dim))


class Block(nnx.Module):
    """One pre-LayerNorm decoder layer: x + drop(Attention(LN1(x))), then
    x + drop(fc2(drop_act(act(fc1(LN2(x)))))); with `mlp="gated"` the MLP is
    fc2(drop_act(act(gate(y)) * fc1(y))), and with `parallel_residual` both branches read x:
    x + drop(Attention(LN1(x))) + drop(MLP(LN2(x))). `dropout` applies to the attention output and the MLP
    output before each residual addition, `activation_dropout` after the MLP's activation,
    `attention_dropout` inside Attention; all only with a key (training). Evaluating a long
    sequence (no key, `is_long` at `attention_block`), the MLP runs on `attention_block`
    positions at a time (`by_chunks`), so that no B x T x mlp_dim activation exists."""

    def __init__(self, cfg: ModelConfig, scheme: posenc.Scheme, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.ln1 = norm_layer(cfg, rngs)
        self.attn = Attention(cfg, scheme, rngs=rngs)
        self.ln2 = norm_layer(cfg, rngs)
        self.fc1 = linear(cfg, cfg.d_model, cfg.mlp_dim, cfg.mlp_bias, rngs)
        self.fc2 = linear(cfg, cfg.mlp_dim, cfg.d_model, cfg.mlp_bias, rngs)
        if cfg.mlp == "gated":
            self.gate = linear(cfg, cfg.d_model, cfg.mlp_dim, cfg.mlp_bias, rngs)
        if cfg.post_norms:  # Gemma 2 / 3: each branch's output normed before the residual addition
            self.ln_attn_out = norm_layer(cfg, rngs)
            self.ln_mlp_out = norm_layer(cfg, rngs)

    def __call__(self, x_BxTxD, positions_BxT, key=None):
        k_attn, k_res1, k_act, k_res2 = _split(key, 4)
        post = self.cfg.post_norms
        attended = self.attn(self.ln1(x_BxTxD), positions_BxT, k_attn)
        attended = dropout(self.ln_attn_out(attended) if post else attended, self.cfg.dropout, k_res1)
        if not self.cfg.parallel_residual:
            x_BxTxD = x_BxTxD + attended
        activation = ACTIVATIONS[self.cfg.activation]

        def mlp(x):
            y = self.ln2(x)
            h = activation(self.gate(y)) * self.fc1(y) if self.cfg.mlp == "gated" else activation(self.fc1(y))
            out = self.fc2(dropout(h, self.cfg.activation_dropout, k_act))
            return dropout(self.ln_mlp_out(out) if post else out, self.cfg.dropout, k_res2)

        chunk = self.cfg.attention_block
        if key is None and is_long(x_BxTxD.shape[1], chunk):  # long evaluation: B x chunk x mlp_dim at a time
            out = x_BxTxD + by_chunks(mlp, chunk, x_BxTxD)
        else:
            out = x_BxTxD + mlp(x_BxTxD)
        return out + attended if self.cfg.parallel_residual else out


def by_chunks(fn, chunk: int, *xs_BxTx: jax.Array) -> jax.Array:
    """`fn` (position-wise) applied to `chunk` positions of every row at a time (B * chunk rows per
    call, batch and time flattened), so that its intermediates, and its output where that is consumed
    inside `fn`, are O(chunk) rather than O(T); the rows are zero-padded to whole chunks. `fn` takes
    one array per `xs_BxTx`, each with its leading B x T flattened to rows, and returns rows x ..."""
    b, t = xs_BxTx[0].shape[:2]
    rows, per_call = b * t, b * chunk
    n = -(-rows // per_call)

    def cut(x):
        flat = x.reshape(rows, *x.shape[2:])
        flat = jnp.pad(flat, [(0, n * per_call - rows)] + [(0, 0)] * (flat.ndim - 1))
        return flat.reshape(n, per_call, *x.shape[2:])

    chunks = tuple(cut(x) for x in xs_BxTx)
    out = map_after(lambda args: fn(*args), chunks, chunks)
    return out.reshape(n * per_call, *out.shape[2:])[:rows].reshape(b, t, *out.shape[2:])


class DecoderLM(nnx.Module):
    """The language model: `model(tokens_BxT) -> logits_BxTxV`, `token_nll` for training and
    evaluation, `hidden` for the final hidden states.

    Built from a ModelConfig, the positional scheme's config (posenc; built here with the model's
    dimensions and `train_length`) and an `nnx.Rngs`; `build_model` does it from a seed.
    Positions default to 0 .. T-1 for every row (after the scheme's length check); a
    `dropout_key` means training: dropout on, and a scheme may draw other positions
    (`sample_positions`, e.g. randomized positions)."""

    compile_calls: bool = False  # `model(ids)` outside a trace as one compiled program (see __call__)

    def __init__(self, cfg: ModelConfig, posenc_cfg: Any, train_length: int, *, rngs: nnx.Rngs):
        # Sharding annotations are metadata only: experiment/runtime/sharding.py places the parameters.
        with nnx.use_eager_sharding(False):
            self._build(cfg, posenc_cfg, train_length, rngs)

    def _build(self, cfg: ModelConfig, posenc_cfg: Any, train_length: int, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = DTYPES[cfg.dtype]
        dims = posenc.ModelDims(d_model=cfg.d_model, num_heads=cfg.num_heads,
                                head_dim=cfg.head_size, num_layers=cfg.num_layers,
                                train_length=train_length)
        self.scheme = posenc.build(posenc_cfg, dims, rngs=rngs)
        # Per-layer schemes get one instance per block (the first block's is also `self.scheme`, for
        # `embed`); read off the instance, since a wrapper decides by what it wraps.
        layer_schemes = [self.scheme] * cfg.num_layers
        if self.scheme.traits.per_layer:
            layer_schemes = [self.scheme] + [posenc.build(posenc_cfg, dims, rngs=rngs)
                                             for _ in range(cfg.num_layers - 1)]
        if cfg.local_rope_base:  # Gemma 3: windowed layers keep plain RoPE at their own base
            local = posenc.build(local_rope(posenc_cfg, cfg.local_rope_base), dims, rngs=rngs)
            layer_schemes = [local if cfg.windowed(i) else s for i, s in enumerate(layer_schemes)]
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
        self.blocks = nnx.List([Block(layer_config(cfg, i), scheme, rngs=rngs) for i, scheme in enumerate(layer_schemes)])
        self.ln_f = norm_layer(cfg, rngs)
        if not cfg.tie_embeddings and not cfg.adaptive_cutoffs:
            self.unembed = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False, dtype=dtype,
                                      kernel_init=rows_sharded(), rngs=rngs)

    def embed_tokens(self, tokens_BxT: jax.Array) -> jax.Array:
        """The token embeddings, B x T x D, times sqrt(d_model) where `scale_embeddings`."""
        x = self.embed(tokens_BxT)
        return x * self.cfg.d_model ** 0.5 if self.cfg.scale_embeddings else x

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
        x = self.embed_tokens(tokens_BxT)
        x = dropout(self.scheme.embed(x, positions_BxT), self.cfg.dropout, keys[0])
        for block, key in zip(self.blocks, keys[1:]):
            x = block(x, positions_BxT, key)
        return self.ln_f(x)

    def head(self, x_BxTxD: jax.Array) -> jax.Array:
        """Logits of final hidden states, ... x V, float32 (log-probabilities with adaptive softmax)."""
        if self.cfg.adaptive_cutoffs:
            return self.softmax.log_probs(x_BxTxD)
        if self.cfg.tie_embeddings:
            return self.embed.attend(x_BxTxD).astype(jnp.float32)
        return self.unembed(x_BxTxD).astype(jnp.float32)

    def _by_head_chunks(self, fn, *xs_BxTx: jax.Array) -> jax.Array:
        """`fn(x_rows, ...)` of the head's output over B x T positions: at once, or for a long
        sequence (`is_long`) `attention_block` positions of each row at a time, so that only that many
        rows of logits exist at once where `fn` reduces them (a long sequence's B x T x V logits are
        gigabytes: 3.2 GB for 16k tokens of a 49k vocabulary), and one product per chunk otherwise
        (XLA:CPU runs one T x D x V product several times slower than the chunks, measured in
        benchmarks/README.md)."""
        b, t = xs_BxTx[0].shape[:2]
        if not is_long(t, self.cfg.attention_block):
            return fn(*xs_BxTx)
        return by_chunks(fn, self.cfg.attention_block, *xs_BxTx)

    def __call__(self, tokens_BxT: jax.Array, positions_BxT: jax.Array | None = None,
                 dropout_key: jax.Array | None = None) -> jax.Array:
        """Logits over the vocabulary, B x T x V, float32 (log-probabilities with adaptive softmax).

        Called outside any trace on a model whose `compile_calls` is set (models/hf.py's `load` sets
        it), the call runs as one compiled program (models/compiled.py, compiled once per input
        shape) rather than operation by operation."""
        if self.compile_calls and not _tracing(tokens_BxT, self.embed):
            return compiled.call(self, tokens_BxT, positions_BxT, dropout_key)
        return self._by_head_chunks(self.head, self.hidden(tokens_BxT, positions_BxT, dropout_key))

    def token_nll(self, tokens_BxT: jax.Array, targets_BxT: jax.Array,
                  positions_BxT: jax.Array | None = None,
                  dropout_key: jax.Array | None = None) -> jax.Array:
        """Negative log-likelihood of each target, B x T, float32 (what training and evaluation use)."""
        hidden = self.hidden(tokens_BxT, positions_BxT, dropout_key)
        if self.cfg.adaptive_cutoffs:
            return self.softmax.nll(hidden, targets_BxT)

        def nll(x, targets):
            logits = self.head(x)
            log_z = jax.nn.logsumexp(logits, axis=-1)
            return log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return self._by_head_chunks(nll, hidden, targets_BxT)

    def next_tokens(self, tokens_BxT: jax.Array, positions_BxT: jax.Array | None = None) -> jax.Array:
        """The most likely next token at every position, B x T int32 (greedy prediction: passkey)."""
        hidden = self.hidden(tokens_BxT, positions_BxT)
        return self._by_head_chunks(lambda x: jnp.argmax(self.head(x), axis=-1).astype(jnp.int32), hidden)


def _tracing(tokens_BxT, embed: nnx.Module) -> bool:
    """Whether a call is being traced (inside jit, grad, vmap ...): its tokens or the parameters are."""
    leaves = jax.tree_util.tree_leaves(nnx.state(embed))
    return any(isinstance(x, jax.core.Tracer) for x in [tokens_BxT, *leaves])


def layer_config(cfg: ModelConfig, layer: int) -> ModelConfig:
    """The model config block `layer` runs with. Among windowed layers (global_every), a global layer
    sees every key: no window of its own, and LM-Infinite's sinks and window (attention_sinks, then
    the training length) act there; a windowed layer keeps the sliding window it was trained with
    and no sinks, which would show it keys it never saw (as LM-Infinite leaves a layer alone whose
    window the sequence does not pass)."""
    if not cfg.global_every:
        return cfg
    if cfg.windowed(layer):
        return dataclasses.replace(cfg, attention_sinks=0, attention_sink_distance=0)
    return dataclasses.replace(cfg, attention_window=0)


def local_rope(posenc_cfg: Any, base: float) -> Any:
    """The positional config of windowed layers beside global ones (ModelConfig.local_rope_base):
    plain RoPE at `base`, with the rotated fraction of the run's rope and none of its scalings, which
    act on the global layers only (as Hugging Face's Gemma 3 applies rope scaling)."""
    if posenc_cfg.name not in ("rope", "logn") or "rope" not in posenc_cfg:
        raise ValueError(f"model.local_rope_base sets the RoPE base of windowed layers; positional scheme "
                         f"{posenc_cfg.name!r} has none")
    local = posenc.default_config("rope")
    local.rope.base = float(base)
    local.rope.fraction = float(posenc_cfg.rope.fraction)
    return local


def build_model(model_cfg: ModelConfig, posenc_cfg: Any, train_length: int, seed: int) -> DecoderLM:
    """A DecoderLM with its parameters initialised from `seed` (nnx.Rngs(seed))."""
    return DecoderLM(model_cfg, posenc_cfg, train_length, rngs=nnx.Rngs(seed))
