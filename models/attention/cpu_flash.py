"""Flash attention on the CPU: a compiled C++ kernel (native/flash_attention.cc) for the long forward
passes of evaluation and generation's prefill (`model.attention=cpu_flash`; `auto` takes it there).

XLA:CPU runs blockwise attention (blockwise.py) as separate operations per tile, each a pass over a
B x H x 512 x 512 tile of logits in memory: the products run near the machine's matmul rate, but the
softmax's passes (max, exp, sum) and the copies around them took as long again (benchmarks/README.md,
"Long prefill"). The kernel does one (row, head, block of queries) at a time with its tile of logits in
the core's cache, the softmax fused between its two products, as PyTorch's CPU kernel of
scaled_dot_product_attention does; grouped-query keys and values are read in place (never repeated).

What runs in JAX around it: the scheme's `rotate` (the keys rotated per query head, then one head per
group kept, as generation's cache does: models/generation/attend.py; all of them where the scheme
`rotates_per_head`), a per-query `logit_scale` folded
into the queries, and the layouts the kernel reads (keys in panels of the kernel's width, values per
group). Its row in paths.py takes the schemes whose logits are q . k alone (the rotation family, NoPE,
absolute embeddings, log-n), float32, with or without a sliding window (Mistral's, Gemma 3's local
layers; LM-Infinite's sinks are refused), on the CPU backend. The kernel has no backward pass: a
gradient through it (outside training, where `auto` never takes it) is blockwise attention's,
recomputed.

The kernel's query and key block sizes are chosen per machine the first time it runs: a few
candidates timed on a 4,096-token call, the fastest kept (`blocks`; on disk beside the library, so
once per machine and build). LX_CPU_FLASH_BLOCKS=QxK fixes them (for benchmarks).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from models.attention import native
from models.attention.call import Call
from models.attention.lambda_mask import LambdaMask

# (queries, keys) per block, timed per machine. Blocks of 512 keys ran at half the rate of 256 at 32k tokens
# (though not at 16k) on a Xeon with AVX-512 (benchmarks/README.md, "Long prefill"), so none is a candidate.
CANDIDATES = ((64, 256), (128, 256), (256, 256))
SEARCH_LENGTH = 4096


def backend_refusal() -> str | None:
    """Why the kernel cannot run in this process (None: it can): not the CPU backend, or no library."""
    if jax.default_backend() != "cpu":
        return f"model.attention=cpu_flash runs on the CPU backend only (this is {jax.default_backend()}): use auto"
    why = native.unavailable()
    return f"model.attention=cpu_flash: {why}; use auto (XLA's attention paths)" if why else None


def usable() -> bool:
    """Whether `auto` may take the kernel: the CPU backend, one device (the kernel has no rule to
    partition a sharded batch: XLA would gather it onto every device), and the library built."""
    return jax.default_backend() == "cpu" and jax.device_count() == 1 and native.unavailable() is None


def _window(mask: LambdaMask | None) -> int:
    if mask is None:
        return 0
    assert mask.sinks == 0, "the row in paths.py refuses LM-Infinite's sinks"
    return mask.window


def flash(q_BxTxHxK, k_BxTxGxK, v_BxTxGxV, scale: float, window: int = 0, blocks: tuple[int, int] | None = None,
          moves: "Moves | None" = None):
    """softmax(scale * q k^T) v under the causal mask (and a sliding `window` of keys: t - j < window;
    0: none), float32; k and v have G heads, each serving H / G query heads. With `moves`, each pair's
    logit is that of the variant of q and k its coordinates pick (Moves). Differentiable (the
    gradient is blockwise attention's, or with moves a dense one's by blocks of queries, recomputed)."""
    blocks = blocks or search_blocks(q_BxTxHxK.shape[2], k_BxTxGxK.shape[2], q_BxTxHxK.shape[3], v_BxTxGxV.shape[3])
    if moves is None:
        return _flash(q_BxTxHxK, k_BxTxGxK, v_BxTxGxV, float(scale), int(window), blocks)
    qs, ks = jnp.stack((q_BxTxHxK, *moves.qs)), jnp.stack((k_BxTxGxK, *moves.ks))
    return _flash_moved(qs, ks, v_BxTxGxV, moves.q_coord.astype(jnp.int32), moves.k_coord.astype(jnp.int32),
                        float(scale), int(window), blocks, tuple(int(t) for t in moves.thresholds))


class Moves(NamedTuple):
    """The variants of q (B x T x H x K) and k (B x T x G x K) beside the plain ones (one per threshold),
    int coordinates of queries and keys (B x T), and the increasing thresholds: a pair whose coordinates
    differ by at least thresholds[i] (and less than the next) takes variant i + 1's logit."""
    qs: tuple
    ks: tuple
    q_coord: jax.Array
    k_coord: jax.Array
    thresholds: tuple[int, ...]


def _kernel(q, k, v, scale: float, window: int, blocks: tuple[int, int], q_coord=None, k_coord=None,
            thresholds: tuple[int, ...] = ()) -> jax.Array:
    """q, k: B x T x H x K and B x T x G x K, or R of each (R x ..., R = len(thresholds) + 1)."""
    if q.ndim == 4:
        q, k = q[None], k[None]
    _, b, t, h, d = q.shape
    r, g, dv = k.shape[0], k.shape[3], v.shape[3]
    qb, kb = blocks
    pw, vw = native.panel_width(), native.vector_width()
    tp = -(-t // kb) * kb
    dvp = -(-dv // vw) * vw
    k = jnp.pad(k, ((0, 0), (0, 0), (0, tp - t), (0, 0), (0, 0)))
    k_panels = k.reshape(r, b, tp // pw, pw, g, d).transpose(0, 1, 4, 2, 5, 3)  # R x B x G x Tp/PW x D x PW
    v = jnp.pad(v, ((0, 0), (0, tp - t), (0, 0), (0, dvp - dv))).transpose(0, 2, 1, 3)  # B x G x Tp x Dv
    if q_coord is None:
        q_coord, k_coord = jnp.zeros((b, t), jnp.int32), jnp.zeros((b, tp), jnp.int32)
    else:  # the padding keys (after every query: masked) repeat the last coordinate
        k_coord = jnp.pad(k_coord, ((0, 0), (0, tp - t)), mode="edge")
    thr = (*thresholds, 0, 0)
    out = jax.ffi.ffi_call(native.TARGET, jax.ShapeDtypeStruct((b, t, h, dvp), jnp.float32),
                           vmap_method="sequential")(
        q.astype(jnp.float32), k_panels.astype(jnp.float32), v.astype(jnp.float32), q_coord, k_coord,
        scale=np.float32(scale), qb=np.int64(qb), kb=np.int64(kb), window=np.int64(window),
        thr0=np.int64(thr[0]), thr1=np.int64(thr[1]))
    return out[..., :dv]


def _reference(q, k, v, scale: float, window: int) -> jax.Array:
    """The same attention by XLA's blockwise path (what the gradient differentiates)."""
    from models.attention.blockwise import blockwise_call
    import posenc
    from flax import nnx
    b, t, h, d = q.shape
    reps = h // k.shape[2]
    dims = posenc.ModelDims(d_model=h * d, num_heads=h, head_dim=d, num_layers=1, train_length=t)
    nope = posenc.build(posenc.default_config("nope"), dims, rngs=nnx.Rngs(0))
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask = LambdaMask(sinks=0, window=window, limit=window) if window else None
    call = Call(positions, positions, nope, mask=mask)
    return blockwise_call(q * (scale * d ** 0.5), jnp.repeat(k, reps, 2), jnp.repeat(v, reps, 2), call)


def _reference_moved(qs, ks, v, q_coord, k_coord, scale: float, window: int, thresholds, rows: int = 256):
    """The attention with moves, dense against every key for `rows` queries at a time (each block
    recomputed in the backward pass): what the gradient with moves differentiates."""
    _, b, t, h, d = qs.shape
    reps = h // ks.shape[3]
    ks, v = jnp.repeat(ks, reps, 3), jnp.repeat(v, reps, 2)
    tq = -(-t // rows) * rows
    pad = ((0, 0), (0, 0), (0, tq - t), (0, 0), (0, 0))
    qs_blocks = jnp.pad(qs, pad).reshape(qs.shape[0], b, tq // rows, rows, h, d).transpose(2, 0, 1, 3, 4, 5)
    qc_blocks = jnp.pad(q_coord, ((0, 0), (0, tq - t))).reshape(b, tq // rows, rows).transpose(1, 0, 2)

    @jax.checkpoint
    def one(args):
        i, q_RxBxRowsxHxK, qc_BxRows = args
        logits = jnp.einsum("rbthk,rbshk->rbhts", q_RxBxRowsxHxK, ks, preferred_element_type=jnp.float32) * scale
        apart_Bx1xRowsxS = (qc_BxRows[:, :, None] - k_coord[:, None, :])[:, None]
        picked = sum((apart_Bx1xRowsxS >= th).astype(jnp.int32) for th in thresholds)
        chosen = jnp.take_along_axis(logits, picked[None].repeat(h, 2), axis=0)[0]
        query = i * rows + jnp.arange(rows)[:, None]
        key = jnp.arange(t)[None, :]
        keep = (key <= query) & ((query - key < window) if window else True)
        weights = jax.nn.softmax(jnp.where(keep, chosen, -1e30), axis=-1)  # finite: padded rows stay finite
        return jnp.einsum("bhts,bshk->bthk", weights, v.astype(jnp.float32))

    out = jax.lax.map(one, (jnp.arange(tq // rows), qs_blocks, qc_blocks))  # blocks x B x rows x H x K
    return out.transpose(1, 0, 2, 3, 4).reshape(b, tq, h, -1)[:, :t]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _flash(q, k, v, scale, window, blocks):
    return _kernel(q, k, v, scale, window, blocks)


def _flash_fwd(q, k, v, scale, window, blocks):
    return _kernel(q, k, v, scale, window, blocks), (q, k, v)


def _flash_bwd(scale, window, blocks, residuals, d_out):
    _, vjp = jax.vjp(lambda q, k, v: _reference(q, k, v, scale, window), *residuals)
    return vjp(d_out)


_flash.defvjp(_flash_fwd, _flash_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _flash_moved(qs, ks, v, q_coord, k_coord, scale, window, blocks, thresholds):
    return _kernel(qs, ks, v, scale, window, blocks, q_coord, k_coord, thresholds)


def _flash_moved_fwd(qs, ks, v, q_coord, k_coord, scale, window, blocks, thresholds):
    out = _kernel(qs, ks, v, scale, window, blocks, q_coord, k_coord, thresholds)
    return out, (qs, ks, v, q_coord, k_coord)


def _flash_moved_bwd(scale, window, blocks, thresholds, residuals, d_out):
    qs, ks, v, q_coord, k_coord = residuals
    _, vjp = jax.vjp(lambda qs, ks, v: _reference_moved(qs, ks, v, q_coord, k_coord, scale, window, thresholds),
                     qs, ks, v)
    return (*vjp(d_out), None, None)


_flash_moved.defvjp(_flash_moved_fwd, _flash_moved_bwd)


def cpu_flash_call(q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, call: Call) -> jax.Array:
    """The path's `run` (paths.py): the call's scheme applied around the kernel, keys and values grouped;
    a scheme that moves positions (Self-Extend, DCA, ReRoPE) gives its variants of q and k as well."""
    from models.generation.attend import grouped, repeat_heads
    heads, groups = q_BxTxHxK.shape[2], k_BxTxGxK.shape[2]
    scheme = call.scheme
    q, k = scheme.rotate(q_BxTxHxK, repeat_heads(k_BxTxGxK, heads), call.q_pos, call.k_pos)
    if scheme.traits.rotates_per_head:  # each query head its own keys (FoPE): nothing shared by a group
        v_BxTxGxK = repeat_heads(v_BxTxGxK, heads)
    else:
        k = grouped(k, groups)  # (a move's keys are rotated on for each key head, not each query head)
    variants = scheme.position_variants(q, k, call.q_pos, call.k_pos) if scheme.traits.moves_positions else None
    qs, ks = (variants.qs, variants.ks) if variants else ((q,), (k,))
    scale = scheme.logit_scale(call.q_pos, call.k_pos)
    if scale is not None:  # per query (the row refuses per pair): B x H x T x 1 or a scalar
        scale_BxTxHx1 = jnp.swapaxes(jnp.broadcast_to(scale, (q.shape[0], heads, q.shape[1], 1)), 1, 2)
        qs = tuple(q * scale_BxTxHx1 for q in qs)
    moves = Moves(qs[1:], ks[1:], variants.q_coord, variants.k_coord, variants.thresholds) if variants else None
    out = flash(qs[0], ks[0], v_BxTxGxK, q.shape[-1] ** -0.5, _window(call.mask), moves=moves)
    return out.astype(v_BxTxGxK.dtype)


# ---- the block sizes of this machine ------------------------------------------------------------

_BLOCKS: dict[tuple, tuple[int, int]] = {}


def _fixed_blocks() -> tuple[int, int] | None:
    chosen = os.environ.get("LX_CPU_FLASH_BLOCKS")
    if not chosen:
        return None
    try:
        qb, kb = (int(x) for x in chosen.lower().split("x"))
    except ValueError:
        raise ValueError(f"LX_CPU_FLASH_BLOCKS={chosen!r}: give queries x keys per block, e.g. 128x512") from None
    if qb < 1 or kb < 1 or kb % native.panel_width():
        raise ValueError(f"LX_CPU_FLASH_BLOCKS={chosen!r}: both positive, the keys a multiple of "
                         f"{native.panel_width()} (this build's panel width)")
    return qb, kb


def search_blocks(heads: int, groups: int, head_dim: int, value_dim: int) -> tuple[int, int]:
    """The (query, key) block sizes for these head shapes on this machine: LX_CPU_FLASH_BLOCKS, else the
    fastest of CANDIDATES timed once (a call of SEARCH_LENGTH tokens, each candidate its best of three
    in turns), kept for the process and on disk beside the library."""
    fixed = _fixed_blocks()
    if fixed:
        return fixed
    key = (heads, groups, head_dim, value_dim)
    if key in _BLOCKS:
        return _BLOCKS[key]
    search = hashlib.sha1(repr((CANDIDATES, SEARCH_LENGTH)).encode()).hexdigest()[:8]
    path = native.cache_folder() / f"flash_blocks-{native.build_key()}-{search}.json"
    slug = "h{}g{}d{}v{}".format(*key)
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    if slug in saved:
        _BLOCKS[key] = tuple(saved[slug]["blocks"])
        return _BLOCKS[key]
    times = _time_candidates(heads, groups, head_dim, value_dim)
    best = min(times, key=times.get)
    _BLOCKS[key] = best
    saved[slug] = {"blocks": list(best), "ms": {f"{q}x{k}": round(s * 1e3, 3) for (q, k), s in times.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(saved, indent=1))
        os.replace(partial, path)
    except OSError:
        pass  # kept for the process only
    return best


def _time_candidates(heads: int, groups: int, head_dim: int, value_dim: int) -> dict[tuple[int, int], float]:
    with jax.ensure_compile_time_eval():  # run now, also while a model is being traced (else staged into it)
        return _timed(heads, groups, head_dim, value_dim)


def _timed(heads: int, groups: int, head_dim: int, value_dim: int) -> dict[tuple[int, int], float]:
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, SEARCH_LENGTH, heads, head_dim)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, SEARCH_LENGTH, groups, head_dim)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, SEARCH_LENGTH, groups, value_dim)), jnp.float32)
    pw = native.panel_width()
    runs = {blocks: jax.jit(functools.partial(_kernel, scale=head_dim ** -0.5, window=0, blocks=blocks))
            for blocks in CANDIDATES if blocks[1] % pw == 0}
    best = {}
    for blocks, run in runs.items():
        jax.block_until_ready(run(q, k, v))
    for _ in range(3):
        for blocks, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run(q, k, v))
            best[blocks] = min(best.get(blocks, np.inf), time.perf_counter() - start)
    return best
