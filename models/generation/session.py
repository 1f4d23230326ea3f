"""A model made ready to generate: its copy with a cache in every attention layer, and two compiled
programs, `prefill` (a batch of prompts, right-padded, through the model's usual paths, caches
filled) and `step` (one new token per row against the caches), each giving the next token's logits.

The copy shares the model's parameters (nothing is copied); the caches live in `nnx.Cache`
variables that each program takes in and gives back updated (donated: written in place).
Programs are compiled once per model structure and shapes (rows, prompt bucket, cache slots).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.attention.lambda_mask import lambda_mask
from models.generation.attend import keeps_moved_keys
from models.generation.cache import CacheShape, LayerCache
from models.generation.memory import check_fits

PROMPT_BUCKET = 128  # prompts are right-padded to a multiple of this (few compilations across prompts)


def refusal(model) -> str | None:
    """Why `model` cannot generate with a cache (None: it can): a scheme whose hooks are not
    functions of each token and its position (its `decodes` class attribute says why)."""
    for block in model.blocks:
        why = block.attn.scheme.decode_refusal()
        if why:
            return why
    return None


def padded_length(longest: int) -> int:
    """The length a batch of prompts is right-padded to: a power of two up to PROMPT_BUCKET (at least
    2: one token alone is a decoding step), then multiples of it."""
    if longest <= PROMPT_BUCKET:
        return max(2, 1 << (longest - 1).bit_length())
    return -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET


def _layer_cache(attn, batch: int, slots: int) -> LayerCache:
    cfg, scheme = attn.cfg, attn.scheme
    mask = lambda_mask(cfg, scheme.dims.train_length)
    kv, k = cfg.kv_heads, attn.head_dim
    if scheme.traits.rotates_per_head:  # each query head turns its keys its own way (FoPE): a key per head
        kv = cfg.num_heads
    q = jax.ShapeDtypeStruct((1, 1, cfg.num_heads, k), jnp.dtype(cfg.dtype))
    positions = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    _, rotated = jax.eval_shape(scheme.rotate, q, q, positions, positions)  # a scheme may widen q and k
    moved = 0
    if keeps_moved_keys(scheme):
        moved = len(jax.eval_shape(scheme.position_variants, q, rotated, positions, positions).ks) - 1
    shape = CacheShape(batch, mask.window if mask is not None else slots, kv, rotated.shape[-1], k, k,
                       jnp.dtype(cfg.dtype), moved)
    return LayerCache(shape, mask)


def _with_caches(model, batch: int, slots: int):
    """A copy of `model`'s structure (its arrays shared) with a cache in every attention layer."""
    model = nnx.merge(*nnx.split(model))
    for block in model.blocks:
        block.attn.kv = _layer_cache(block.attn, batch, slots)
    return model


def _head_of_last(model, tokens_BxT, positions_BxT, lengths_B):
    hidden_BxTxD = model.hidden(tokens_BxT, positions_BxT)
    return model.head(hidden_BxTxD[jnp.arange(tokens_BxT.shape[0]), lengths_B - 1])


def _cpu_options() -> dict:
    """XLA:CPU's copy insertion by region analysis: without it, a decoding step copied every layer's
    cache twice (the products read the cache as it came in, while its new slot is written in place);
    CPU only (benchmarks/README.md, "Long prefill")."""
    return {"xla_cpu_copy_insertion_use_region_analysis": True} if jax.default_backend() == "cpu" else {}


@functools.lru_cache(maxsize=8)
def _prefill_program(graphdef, batch: int, slots: int):
    """The prompts through the model (`graphdef`: without caches), its caches made inside the program,
    so that no empty cache is allocated before it and copied over."""
    def prefill(rest, tokens_BxT, positions_BxT, lengths_B):
        model = _with_caches(nnx.merge(graphdef, rest), batch, slots)
        for block in model.blocks:
            block.attn.kv.length[...] = lengths_B
        return _head_of_last(model, tokens_BxT, positions_BxT, lengths_B), nnx.state(model, nnx.Cache)
    return jax.jit(prefill)


@functools.lru_cache(maxsize=8)
def _step_program(graphdef):
    def step(rest, caches, tokens_B, positions_B):
        model = nnx.merge(graphdef, rest, caches)
        hidden_Bx1xD = model.hidden(tokens_B[:, None], positions_B[:, None])
        return model.head(hidden_Bx1xD[:, 0]), nnx.state(model, nnx.Cache)
    return jax.jit(step, donate_argnums=1, compiler_options=_cpu_options())


@dataclasses.dataclass
class Session:
    """A batch of rows being generated: `prefill(prompts)` then `step(tokens)`, each returning the
    logits of every row's next token (B x V, float32, on the device); `lengths` is each row's number
    of tokens so far (host). `graphdef` is the model's with caches (the step's), `plain` its own (the
    prefill's); the caches exist from the prefill on."""
    graphdef: nnx.GraphDef
    plain: nnx.GraphDef
    rest: nnx.State
    caches: nnx.State | None
    lengths: np.ndarray
    slots: int

    @classmethod
    def start(cls, model, batch: int, slots: int) -> "Session":
        """Caches of `slots` tokens per row (ring layers: their window) for `batch` rows of `model`."""
        why = refusal(model)
        if why:
            raise ValueError(why)
        plain, rest = nnx.split(model)
        abstract = nnx.eval_shape(lambda: _with_caches(model, batch, slots))
        check_fits(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(abstract, nnx.Cache))),
                   batch, slots)
        graphdef = nnx.graphdef(abstract)
        return cls(graphdef, plain, rest, None, np.zeros(batch, np.int64), slots)

    def prefill(self, prompts: list[list[int]]) -> jax.Array:
        """The prompts (one per row, each at least one token), right-padded: a pad takes its row's last
        position, so that nothing of a row depends on its padding (attention is causal by index, and a
        length-dependent scaling sees the row's own last position)."""
        if len(prompts) != len(self.lengths):
            raise ValueError(f"this session generates {len(self.lengths)} rows; got {len(prompts)} prompts")
        logits, self.caches, self.lengths = self._prefilled(prompts)
        return logits

    def prefill_shared(self, prefix: list[int]) -> jax.Array:
        """One prompt's prefix through the model once, its caches then copied to every row of the
        session (each row goes on from it with its own tokens: `step`); the logits after it, per row."""
        rows = len(self.lengths)
        logits, caches, lengths = self._prefilled([prefix])
        self.caches = jax.tree.map(lambda x: jnp.repeat(x, rows, axis=0), caches)  # every leaf: rows first
        del caches
        self.lengths = np.repeat(lengths, rows)
        return jnp.repeat(logits, rows, axis=0)

    def _prefilled(self, prompts: list[list[int]]):
        """(logits, caches, lengths) of `prompts` right-padded through the prefill program of their count."""
        lengths = np.array([len(p) for p in prompts])
        if lengths.max() > self.slots:
            raise ValueError(f"a prompt of {lengths.max()} tokens does not fit caches of {self.slots} tokens per row")
        t = padded_length(int(lengths.max()))
        tokens = np.zeros((len(prompts), t), np.int32)
        for row, prompt in enumerate(prompts):
            tokens[row, :len(prompt)] = prompt
            tokens[row, len(prompt):] = prompt[-1]
        positions = np.minimum(np.arange(t)[None, :], lengths[:, None] - 1).astype(np.int32)
        run = _prefill_program(self.plain, len(prompts), self.slots)
        self.caches = None  # (a second prefill: the earlier caches go first)
        logits, caches = run(self.rest, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(lengths, jnp.int32))
        return logits, caches, lengths.astype(np.int64)

    def step(self, tokens_B) -> jax.Array:
        """One new token per row (at position `lengths`), cached; the logits after it."""
        if self.lengths.max() >= self.slots:
            raise ValueError(f"the caches hold {self.slots} tokens per row; a row has that many already")
        if self.caches is None:
            raise ValueError("prefill the session's prompts before its first step")
        run = _step_program(self.graphdef)
        logits, self.caches = run(self.rest, self.caches, jnp.asarray(tokens_B, jnp.int32),
                                  jnp.asarray(self.lengths, jnp.int32))
        self.lengths = self.lengths + 1
        return logits
