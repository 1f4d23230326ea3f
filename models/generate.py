"""Text generation with a key / value cache: `generate(model, prompts, max_new_tokens, ...)`.

    from models import hf
    from models.generate import generate
    model, tokenizer = hf.load("smollm2")
    ids = generate(model, [tokenizer.encode("The capital of France is").ids], 16)[0]
    print(tokenizer.decode(ids))

Works on what `models.hf.load` returns and on a run's model (experiment/generation.py opens one with
its eval-time options and a training-free method). The prompts of a batch may differ in length. Each
prompt goes through the model's usual attention paths once (blockwise for a long one: memory
bounded as in evaluation), filling a cache in every layer; each new token then reads the cache: O(T)
work per token, nothing recomputed. Every scheme and every training-free method applies while
decoding as in a full forward pass over the same tokens (models/generation/attend.py; the tests
compare the logits of every step). Caches: one slot per token, or for a windowed layer (Mistral's
sliding window, Gemma 3's local layers, LM-Infinite) a ring of its window, plus LM-Infinite's sinks:
its memory is bounded by the window, not the length. Dynamic NTK, dynamic YaRN and LongRoPE, whose
frequencies follow the length: a cached key keeps the frequencies of the step it entered at, and a
new token's query and key use the current length (transformers' convention, models/generation/cache.py).
"""
from __future__ import annotations

import ctypes
import math
import numbers
import sys
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from models.generation.session import Session, padded_length
from models.generation.stops import Stops

OnToken = Callable[[int, Callable[[], list[list[int]]]], None]  # (tokens done, the new ids so far) -> None
SLOT_ROUND = 128  # cache slots per row: the padded prompt plus the new tokens, rounded up to this


def _count(value, name: str) -> int:
    """`value`, a count: an int (or NumPy integer) >= 1; a float, even 2.0, is refused (a count is not one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1 (an int), got {value!r}")
    return int(value)


def _checked_sampling(temperature, top_p, seed) -> tuple[float, float, int]:
    """(temperature, top_p, seed) checked: finite numbers, temperature >= 0, top_p in (0, 1], a whole seed."""
    def real(value, name):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        return float(value)
    temperature, top_p = real(temperature, "temperature"), real(top_p, "top_p")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature} and {top_p}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be a whole number, got {seed!r}")
    return temperature, top_p, int(seed)


def _checked(prompts, max_new_tokens: int, vocab_size: int) -> list[list[int]]:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts: give a non-empty list of prompts, each a list of token ids")
    out = []
    for i, prompt in enumerate(prompts):
        ids = [int(t) for t in np.asarray(prompt).ravel()]
        if not ids:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} holds token id {bad[0]}, outside the model's vocabulary of {vocab_size}")
        out.append(ids)
    return out


def sample(logits_BxV: jax.Array, key: jax.Array, temperature: float, top_p: float) -> jax.Array:
    """The next token of each row: the most likely one at temperature 0, else a draw from
    softmax(logits / temperature) restricted to the smallest set of most likely tokens whose
    probability reaches `top_p` (nucleus sampling; 1 keeps every token)."""
    if temperature == 0.0:
        return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    logits = logits_BxV / temperature
    if top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        before = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1) - jax.nn.softmax(sorted_logits, axis=-1)
        sorted_logits = jnp.where(before < top_p, sorted_logits, -jnp.inf)  # the first token always stays
        logits = jnp.full_like(logits, -jnp.inf).at[jnp.arange(logits.shape[0])[:, None], order].set(sorted_logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


_sample = jax.jit(sample, static_argnums=(2, 3))


def _slots(model, prompts: list[list[int]], max_new_tokens: int) -> int:
    """Cache slots per row for `prompts` and their new tokens (the scheme checked for that length)."""
    longest = max(len(p) for p in prompts)
    model.scheme.check_length(longest + max_new_tokens)
    return -(-(padded_length(longest) + max_new_tokens) // SLOT_ROUND) * SLOT_ROUND


def generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, stop: Sequence[int | str] | None = None,
             tokenizer=None, stats: dict | None = None, on_token: OnToken | None = None) -> list[list[int]]:
    """The new token ids of each prompt (without the prompt): greedy at temperature 0, else sampled
    (`temperature`, `top_p`, draws from `seed`). `stop`: token ids and / or strings that end a row;
    the stop is not returned (a string: the tokens from the one in which it begins are dropped;
    strings need `tokenizer`, a `tokenizers.Tokenizer` or anything with `decode(ids)`). A row also
    ends after `max_new_tokens`. `stats`, where given, receives the seconds of the prefill and of the
    decoding steps (compilations included) and the number of tokens of each. `on_token(done, so_far)`,
    where given, is called after each new token of every row (`done` of `max_new_tokens`; `so_far()`:
    the new ids until now, as returned): a caller's progress line, or its safe point for Ctrl-C
    (generate.py raises there, and prints the text so far)."""
    temperature, top_p, seed = _checked_sampling(temperature, top_p, seed)
    max_new_tokens = _count(max_new_tokens, "max_new_tokens")
    prompts = _checked(prompts, max_new_tokens, model.cfg.vocab_size)
    stops = Stops(stop, tokenizer, len(prompts))
    start = time.perf_counter()
    session = Session.start(model, len(prompts), _slots(model, prompts, max_new_tokens))
    logits = session.prefill(prompts)
    key = jax.random.key(seed)
    steps, prefilled = 0, None
    for step in range(max_new_tokens):
        ids = np.asarray(_sample(logits, jax.random.fold_in(key, step), float(temperature), float(top_p)))
        prefilled = prefilled or time.perf_counter()
        stops.add(ids)
        if on_token is not None:
            on_token(step + 1, stops.outputs)
        if stops.all_done() or step == max_new_tokens - 1:
            break
        logits = session.step(ids)
        steps += 1
    if stats is not None:
        stats.update(prefill_seconds=prefilled - start, prefill_tokens=sum(len(p) for p in prompts),
                     decode_seconds=time.perf_counter() - prefilled, decode_steps=steps * len(prompts))
    del session, logits
    release_freed_host_memory()
    return stops.outputs()


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many first tokens every prompt shares, leaving each at least one token of its own."""
    shortest = min(len(p) for p in prompts)
    n = 0
    while n < shortest - 1 and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def generate_shared(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                    stop: Sequence[int | str] | None = None, tokenizer=None, stats: dict | None = None,
                    on_token: OnToken | None = None) -> list[list[int]]:
    """Greedy answers to prompts that begin alike (k questions about one long context): the tokens they
    share go through the model once, their caches are copied to one row per prompt, and each row reads
    the rest of its prompt a token at a time against its cache, then answers. The same new ids as
    `generate(model, prompts, ...)` at temperature 0 (each step's logits those of a full forward pass
    over the row's tokens, as every decoding step's are), at the cost of one prefill of the shared part
    and a decoding step per token of each prompt's own part. `stats` as `generate`'s, with
    `shared_tokens`; `on_token` as `generate`'s, after every step (`done`: the most new tokens of a row)."""
    max_new_tokens = _count(max_new_tokens, "max_new_tokens")
    prompts = _checked(prompts, max_new_tokens, model.cfg.vocab_size)
    stops = Stops(stop, tokenizer, len(prompts))
    shared = shared_prefix_length(prompts)
    if shared == 0:
        return generate(model, prompts, max_new_tokens, stop=stop, tokenizer=tokenizer, stats=stats)
    start = time.perf_counter()
    session = Session.start(model, len(prompts), _slots(model, prompts, max_new_tokens))
    logits = session.prefill_shared(prompts[0][:shared])
    prefilled = time.perf_counter()
    own = [list(p[shared:]) for p in prompts]
    own_length = np.array([len(o) for o in own])
    read = np.zeros(len(prompts), np.int64)  # tokens of its own part each row has read
    new = np.zeros(len(prompts), np.int64)
    key, steps = jax.random.key(0), 0  # (unused at temperature 0)
    while True:
        answering = read >= own_length
        greedy = np.asarray(_sample(logits, key, 0.0, 1.0))
        ids = np.array([greedy[r] if answering[r] else own[r][read[r]] for r in range(len(prompts))], np.int32)
        stops.add(ids, active=answering)
        new += answering
        stops.done |= answering & (new >= max_new_tokens)
        if on_token is not None:
            on_token(int(new.max()), stops.outputs)
        if stops.all_done():
            break
        read += ~answering
        logits = session.step(ids)
        steps += 1
    if stats is not None:
        stats.update(prefill_seconds=prefilled - start, prefill_tokens=shared, shared_tokens=shared,
                     decode_seconds=time.perf_counter() - prefilled, decode_steps=steps * len(prompts))
    del session, logits
    release_freed_host_memory()
    return stops.outputs()


def release_freed_host_memory() -> None:
    """Give the memory glibc keeps after a generation (its caches, the compiler's work on a new shape)
    back to the system, on the CPU backend: else the next prompt's caches come on top of it (a 16k
    prompt of SmolLM2-135M: 2.6 GB peak instead of 1.9; benchmarks/README.md, "Long prefill")."""
    if jax.default_backend() != "cpu" or not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)
