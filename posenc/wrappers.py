"""Schemes that wrap any other registered scheme: log-n logit scaling, its learned sibling
Scalable-Softmax, and randomized positions.

A wrapper names its inner scheme in `base` and builds it from the same `posenc` config block, so
`--config.posenc.name=logn --config.posenc.logn.base=rope --config.posenc.rope.base=500000`
configures both. Every hook is delegated to the inner scheme; the wrapper changes one thing.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.base import LengthError, ModelDims, Scheme, build
from posenc.options.wrappers import LognOptions, RandomizedOptions, SsmaxOptions
from posenc.registry import get, register
from posenc.traits import Traits


class Wrapper(Scheme):
    """Delegates every hook to `self.inner`, the scheme named by `options.base`. Its traits are the
    inner scheme's plus what the wrapper's class traits switch on (`traits_around`)."""
    traits = Traits(wrapper=True)

    def __init__(self, options: Any, dims: ModelDims, *, rngs: nnx.Rngs, posenc_cfg: Any = None,
                 chain: tuple[str, ...] = ()):
        super().__init__(options, dims, rngs=rngs)
        chain = tuple(chain) + (self.name,)  # the wrappers around the inner scheme, outermost first
        get(options.base)  # unknown names: the registry's error, listing the valid ones
        if options.base in chain:
            raise ValueError(f"positional scheme {self.name!r} cannot wrap {options.base!r}: the chain "
                             f"{' -> '.join(chain + (options.base,))} wraps itself")
        inner_cfg = {key: posenc_cfg[key] for key in posenc_cfg.keys()} if posenc_cfg is not None else {}
        inner_cfg.update(name=options.base)
        self.inner = build(inner_cfg, dims, rngs=rngs, chain=chain)
        self.traits = self.traits_around(self.inner.traits)

    def traits_around(self, inner: Traits) -> Traits:
        """The traits of this wrapper around a scheme with traits `inner`: those, with every flag
        that this wrapper's class traits set switched on (ssmax: per_layer; randomized and pose:
        samples_positions)."""
        own = type(self).traits
        return inner.replace(**{f.name: True for f in dataclasses.fields(Traits) if getattr(own, f.name) is True})

    def embed(self, x_BxTxD, positions_BxT):
        return self.inner.embed(x_BxTxD, positions_BxT)

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        return self.inner.rotate(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        return self.inner.bias(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)

    def bias_fn(self):
        return self.inner.bias_fn()

    def value_bias(self, probs_BxHxTxS, q_pos_BxT, k_pos_BxS):
        return self.inner.value_bias(probs_BxHxTxS, q_pos_BxT, k_pos_BxS)

    def carried_bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, carry_BxHxT):
        return self.inner.carried_bias(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, carry_BxHxT)

    def logit_scale(self, q_pos_BxT, k_pos_BxS):
        return self.inner.logit_scale(q_pos_BxT, k_pos_BxS)

    def token_context(self, x_BxTxD, positions_BxT):
        return self.inner.token_context(x_BxTxD, positions_BxT)

    def context_bias(self, q_ctx_BxTxC, k_ctx_BxSxC, q_pos_BxT, k_pos_BxS):
        return self.inner.context_bias(q_ctx_BxTxC, k_ctx_BxSxC, q_pos_BxT, k_pos_BxS)

    def transform_logits(self, scores_BxHxTxS, bias_BxHxTxS, q_pos_BxT, k_pos_BxS):
        return self.inner.transform_logits(scores_BxHxTxS, bias_BxHxTxS, q_pos_BxT, k_pos_BxS)

    def check_length(self, length):
        self.inner.check_length(length)

    def decode_refusal(self):
        return super().decode_refusal() or self.inner.decode_refusal()

    def sample_positions(self, positions_BxT, key, training=True):
        return self.inner.sample_positions(positions_BxT, key, training)


def logn_scale(q_pos_BxT: jax.Array, train_length: int) -> jax.Array:
    """max(1, log(n) / log(L_train)), n = q_pos + 1 keys seen by the query; B x T."""
    n = q_pos_BxT.astype(jnp.float32) + 1.0
    return jnp.maximum(1.0, jnp.log(n) / math.log(train_length))


@register("logn")
class LogN(Wrapper):
    """Log-n attention scaling around any scheme: the query vector at position m (which attends to
    n = m + 1 keys) is multiplied by max(1, log n / log L_train), after the inner scheme's
    rotation. Within the training length nothing changes; beyond it the softmax is sharpened so
    that its entropy does not grow with the number of keys.

    Scaling the query, as the reference implementations do (bojone/rerope, which ships log-n with
    ReRoPE), scales every term of the logit that is linear in q: the (rotated) q.k, ReRoPE's
    rectified score, the q-terms of Shaw, Transformer-XL and DeBERTa (c2p), CoPE's q.e (and, since
    its gates read q.k, CoPE's gates); position-only biases (ALiBi, T5, KERPLE, ...) are not
    scaled, and the inner scheme's own `logit_scale` applies as before.

    Chiang & Cholak, "Overcoming a Theoretical Limitation of Self-Attention", ACL 2022 (scale by
    log n); Su, "从熵不变性看Attention的Scale操作" (kexue.fm/archives/8823, 2021: log n / log L_train,
    the form used here). Needs L_train >= 2. Extends to any length the inner scheme does.
    """
    family = "wrapper"
    citation = "Chiang & Cholak 2022; Su 2021"
    extrapolates = "partly"  # as far as its inner scheme (rope by default) does
    Options = LognOptions

    def __init__(self, options: LognOptions, dims: ModelDims, *, rngs: nnx.Rngs, posenc_cfg: Any = None,
                 chain: tuple[str, ...] = ()):
        if dims.train_length < 2:
            raise ValueError(f"logn divides by log(train_length); it needs train_length >= 2, got {dims.train_length}")
        super().__init__(options, dims, rngs=rngs, posenc_cfg=posenc_cfg, chain=chain)

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        q_BxTxHxK, k_BxSxHxK = self.inner.rotate(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
        scale_BxTx1x1 = logn_scale(q_pos_BxT, self.dims.train_length)[:, :, None, None]
        return (q_BxTxHxK * scale_BxTx1x1).astype(q_BxTxHxK.dtype), k_BxSxHxK


@register("ssmax")
class SSMax(Wrapper):
    """Scalable-Softmax around any scheme: the logits z of a query that attends to n keys go
    through softmax((s_h log n) z), i.e. softmax over n^(s_h z), instead of softmax(z), with s_h a
    learned scalar per layer and head, in training and in evaluation alike. A long row's
    distribution then does not flatten as n grows ("attention fading"). With `bias`, the factor
    is s_h log n + b_h, b_h learned from 0 (a variant of the paper's, which the reference notes
    speeds up training but can hurt length generalisation).

    Nakanishi, "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399, 2025 (no code
    released); ported from gdevos010/Scalable-Softmax's `ScalableSoftmax` (src/scalable_softmax.py:
    softmax((s log n + b) x) over a vector of n elements, s initialised at 0.43, b at 0). In a
    causal row n = m + 1 keys, m the query's position (what `logn` uses too). As `logn` does, the
    factor multiplies the query vector after the inner scheme's rotation (the same as scaling
    q.k, and it keeps fused kernels usable), so it scales every term of the logit linear in q but
    not position-only biases (ALiBi, T5, ...), which the reference's input vector would include: a
    departure from the paper's softmax((s log n) z), named in the the reference defaults of docs/schemes.md and in
    the table of every scheme (configs/all_schemes.py: NOTES). Measured (issue 34; random q, k, v,
    4 heads of 32, s = 0.43): around alibi the attention outputs of the two forms differ by up to 0.73
    within 64 positions and 3.8 at 1,024 (kerple_log 0.54 / 2.4, t5 at initialisation 0.02 / 0.08);
    around rope, the default base, which has no bias, they are the same. Since s is per layer, the
    wrapper is built once per layer, and with it the inner scheme (whose parameters, if any, are then
    per layer too).
    """
    family = "wrapper"
    citation = "Nakanishi 2025"
    extrapolates = "partly"  # as far as its inner scheme (rope by default) does
    Options = SsmaxOptions
    traits = Traits(wrapper=True, per_layer=True)  # s is per layer, whatever the inner scheme shares

    def __init__(self, options: SsmaxOptions, dims: ModelDims, *, rngs: nnx.Rngs, posenc_cfg: Any = None,
                 chain: tuple[str, ...] = ()):
        super().__init__(options, dims, rngs=rngs, posenc_cfg=posenc_cfg, chain=chain)
        self.s = nnx.Param(jnp.full((dims.num_heads,), options.s_init, jnp.float32))
        self.b = nnx.Param(jnp.zeros((dims.num_heads,), jnp.float32)) if options.bias else None

    def factor(self, q_pos_BxT: jax.Array) -> jax.Array:
        """s_h log n (+ b_h), n = q_pos + 1 keys seen by the query; B x T x H."""
        log_n_BxTx1 = jnp.log(q_pos_BxT.astype(jnp.float32) + 1.0)[..., None]
        factor = log_n_BxTx1 * self.s[...]
        return factor + self.b[...] if self.b is not None else factor

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        q_BxTxHxK, k_BxSxHxK = self.inner.rotate(q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS)
        return (q_BxTxHxK * self.factor(q_pos_BxT)[..., None]).astype(q_BxTxHxK.dtype), k_BxSxHxK


def sorted_random_positions(key: jax.Array, batch: int, length: int, max_length: int) -> jax.Array:
    """B x T int32: per row, a uniformly random T-subset of [0, max_length), in increasing order."""
    def row(k):
        return jnp.sort(jax.random.choice(k, max_length, (length,), replace=False))
    return jax.vmap(row)(jax.random.split(key, batch)).astype(jnp.int32)


@register("randomized")
class Randomized(Wrapper):
    """Randomized positional encodings around any scheme: a length-T sequence gets the positions
    of a sorted, uniformly random T-subset of [0, L), a new one per row and step in training.

    Evaluation (`eval_positions=sampled`, the default) samples too, as the reference does on every
    forward pass (google-deepmind/randomized_positional_encodings): test sequences have the same
    kind of gaps as training ones. Each evaluation window gets its own subset, drawn from the
    run's seed and the window's index, so a result does not depend on batch size or device count.
    Test lengths must then be <= L (the paper chooses L above the longest test length).
    `eval_positions=consecutive` evaluates at 0 .. T-1 instead (gaps the model never saw; our
    earlier behaviour), which also allows T > L where the inner scheme can encode it.

    Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg & Veness, "Randomized Positional
    Encodings Boost Length Generalization of Transformers", ACL 2023. Our default L = 16 x
    train_length matches the longest evaluation multiplier of the demo sweep (1x .. 16x). The inner
    scheme must encode positions up to L - 1 (`check_length` asks it for max(length, L)).
    """
    family = "wrapper"
    citation = "Ruoss et al. 2023"
    extrapolates = "with option"  # up to max_length (a training-time choice)
    Options = RandomizedOptions
    traits = Traits(wrapper=True, samples_positions=True)

    def __init__(self, options: RandomizedOptions, dims: ModelDims, *, rngs: nnx.Rngs, posenc_cfg: Any = None,
                 chain: tuple[str, ...] = ()):
        super().__init__(options, dims, rngs=rngs, posenc_cfg=posenc_cfg, chain=chain)
        if options.max_length < 0:
            raise ValueError(f"randomized.max_length must be >= 0 (0 = 16 x train_length), got {options.max_length}")
        if options.eval_positions not in ("sampled", "consecutive"):
            raise ValueError(f"randomized.eval_positions must be 'sampled' or 'consecutive', "
                             f"got {options.eval_positions!r}")
        self.max_length = options.max_length or 16 * dims.train_length

    def check_length(self, length):
        if self.options.eval_positions == "sampled" and length > self.max_length:
            raise LengthError(
                f"positional scheme 'randomized' samples evaluation positions from [0, {self.max_length}) "
                f"but length {length} was requested; train with --config.posenc.randomized.max_length={length} "
                f"(or larger), or evaluate with --set posenc.randomized.eval_positions=consecutive")
        self.inner.check_length(max(length, self.max_length))

    def decode_refusal(self):
        if self.options.eval_positions != "consecutive":
            return ("positional scheme 'randomized' evaluates at positions drawn per window; generation runs at "
                    "0, 1, 2, ...: set --set posenc.randomized.eval_positions=consecutive")
        return super().decode_refusal()

    def sample_positions(self, positions_BxT, key, training=True):
        if not training and self.options.eval_positions == "consecutive":
            return self.inner.sample_positions(positions_BxT, key, training)
        b, t = positions_BxT.shape
        if t > self.max_length:
            raise LengthError(
                f"positional scheme 'randomized' draws positions from [0, {self.max_length}) "
                f"but length {t} was requested; set --config.posenc.randomized.max_length={t} (or larger)")
        sampled = sorted_random_positions(key, b, t, self.max_length).astype(positions_BxT.dtype)
        return self.inner.sample_positions(sampled, jax.random.fold_in(key, 1), training)
