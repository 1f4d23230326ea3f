"""Fused causal attention in Pallas (JAX's kernel language), with the positional bias computed
inside the kernel from positions, forward and backward (`model.attention=pallas`).

Flash attention's scheme (Dao et al. 2022): one program per (sequence, head, query block) streams
the key blocks up to the diagonal with an online softmax in float32; the tiles above the diagonal
are never visited, and only the diagonal tile is masked. The backward pass recomputes each tile's
probabilities from the saved log-sum-exp: one kernel accumulates dQ (walking key blocks), one
accumulates dK and dV (walking query blocks), with dS = P * (dP - rowsum(dO * O)).

The bias is never materialised: a scheme provides `bias_fn()` (posenc.base.BiasFunction), an
elementwise function of (query positions, key positions) and its parameters for one head, and / or
a learned table read at an elementwise index (T5's buckets, gathered from memory). The kernel
evaluates it per tile, and the dQ kernel also takes its vector-Jacobian product with the tile's dS
(for a table: one masked sum of dS per entry), so that the bias's learned parameters (T5's table,
KERPLE's r1 / r2, FIRE's MLP) get their gradients: per (sequence, head, query block) partial sums,
added up outside the kernel. Where a bias is constant beyond some distance (T5), tiles wholly that
far back take one value and one sum.
Schemes without a bias (the RoPE family, absolute embeddings, NoPE) use the same kernel without
one; a per-query logit scale (log-n) is folded into the queries.

Attention dropout is drawn inside the kernel from a counter-based hash of (seed, sequence, head,
query index, key index), so the backward pass regenerates the same mask without storing it.

On GPU the kernels lower through Triton. Elsewhere they run in Pallas' interpreter (slow; what the
CPU tests use to check them against dense attention), so `auto` picks this path only on GPU, and
only after a small probe compiled there (`available`).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from models.attention.dense import NEG_INF, NO_DROPOUT, Dropout, padded_values
from models.attention.triangular import supports as triangular_supports
from posenc import Scheme

BLOCK = 64  # query and key rows per tile
# Triton (not Mosaic GPU, JAX's other GPU backend for Pallas, which needs other kernels)
TRITON = pl_triton.CompilerParams(num_warps=4, num_stages=2)


@dataclasses.dataclass(frozen=True)
class Launch:
    """How the kernels run: query and key rows per tile, and whether in Pallas' interpreter (None:
    wherever the backend is not a GPU, `interpreted`)."""
    block: int = BLOCK
    interpret: bool | None = None


def supports(scheme: Scheme, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> bool:
    """Whether the kernel can express `scheme`: what the triangular path can (a rotation, a
    per-query logit scale, an additive bias; no value term, no bias over whole rows), with the
    bias given as `bias_fn` (or none), and no bias from the layer's input (`reads_input`, FoX)."""
    if not triangular_supports(scheme, q_pos_BxT, k_pos_BxS) or scheme.reads_input:
        return False
    if scheme.bias_fn() is not None:
        return True
    probe_q = jnp.zeros((1, 1, scheme.dims.num_heads, scheme.dims.head_dim), jnp.float32)
    return scheme.bias(probe_q, probe_q, q_pos_BxT[:1, :1], k_pos_BxS[:1, :1]) is None


def per_device() -> bool:
    """Whether this is traced per device (inside `shard_map` over every axis of the mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and set(mesh.manual_axes) == set(mesh.axis_names)


def interpreted() -> bool:
    """Whether the kernels run in Pallas' interpreter here (everywhere but on GPU)."""
    return jax.default_backend() != "gpu"


_AVAILABLE: dict = {}  # (scheme, heads, head size, dtype) -> whether the kernel compiles here
_WARNED: set = set()


def probe(scheme: Scheme, dtype):
    """A tiny forward and backward pass of the kernel for `scheme`, traced from shapes alone (the
    scheme's parameters may be tracers of the model being traced): lower it, then compile it."""
    graphdef, state = nnx.split(scheme)
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    pos = np.arange(BLOCK, dtype=np.int32)[None]

    def loss(q, state):
        out = pallas_attention(q, q, q, pos, pos, nnx.merge(graphdef, state), Dropout(0.1, jax.random.key(0)),
                               Launch(interpret=False))
        return out.astype(jnp.float32).sum()
    q = jax.ShapeDtypeStruct((1, BLOCK, scheme.dims.num_heads, scheme.dims.head_dim), dtype)
    return jax.jit(jax.grad(loss, argnums=(0, 1))).trace(q, shapes)


def available(scheme: Scheme, dtype) -> bool:
    """Whether this scheme's kernel compiles on the default backend (GPU): `probe` is compiled once
    per (scheme, heads, head size, dtype). A failure is printed once and `auto` keeps the other
    paths. Never true where the kernel is interpreted, nor on several devices unless the model runs
    per device (inside `shard_map`, as training does there: models/attention/choice.py,
    `runs_per_device`): the kernel has no partitioning rule, so XLA would gather a sharded
    batch onto every device."""
    if interpreted() or (jax.device_count() > 1 and not per_device()):
        return False
    key = (scheme.name, scheme.dims.num_heads, scheme.dims.head_dim, jnp.dtype(dtype).name)
    if key not in _AVAILABLE:
        try:
            probe(scheme, dtype).lower().compile()
            _AVAILABLE[key] = True
        except Exception as e:  # noqa: BLE001 - any lowering failure means: use another path
            print(f"model.attention=auto: the Pallas kernel does not compile for {scheme.name!r} here "
                  f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); using the XLA path")
            _AVAILABLE[key] = False
    return _AVAILABLE[key]


def pallas_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                     dropout: Dropout = NO_DROPOUT, launch: Launch = Launch()) -> jax.Array:
    """Causal softmax(scale * q k^T / sqrt(K) + bias) v, equal to `dense_attention` up to float32
    rounding (with dropout: the same distribution, from the kernel's own mask). Queries attend to
    keys at or before their own index; positions feed only the bias."""
    if not supports(scheme, q_pos_BxT, k_pos_BxT):
        raise ValueError(f"positional scheme {scheme.name!r} adds a value term, scales logits per key, needs "
                         f"whole rows, has a bias without `bias_fn` or from the layer's input, transforms logits "
                         f"or is not a softmax; model.attention=pallas cannot express it: use auto, dense or "
                         f"triangular")
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    b, t, h, d = q_BxTxHxK.shape
    value_dim, v_BxTxHxK = v_BxTxHxK.shape[-1], padded_values(v_BxTxHxK, d)  # one head size in the kernel
    scale = scheme.logit_scale(q_pos_BxT, k_pos_BxT)
    if scale is not None:  # per query, B x H|1 x T x 1: (q * scale) . k == scale * (q . k)
        scale_BxTx1x1 = jnp.broadcast_to(scale, (b, 1, t, 1)).reshape(b, t, 1, 1)
        q_BxTxHxK = (q_BxTxHxK * scale_BxTx1x1).astype(k_BxTxHxK.dtype)
    bias = scheme.bias_fn()
    treedef, shared, per_head = None, [], []
    if bias is not None:
        shared, shared_def = jax.tree.flatten(bias.shared)
        per_head, head_def = jax.tree.flatten(bias.per_head)
        treedef = None if bias.fn is None else (shared_def, head_def, bias.fn)
        if bias.table is not None:  # the lookup table travels as the last per-head leaf
            per_head = per_head + [bias.table]
    block = launch.block
    pad = -t % block
    if pad:  # padded queries and keys come after every real query; their positions continue the rows
        grow = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
        more = lambda p: jnp.concatenate([p, p[:, -1:] + 1 + jnp.arange(pad, dtype=p.dtype)], axis=1)
        q_BxTxHxK, k_BxTxHxK, v_BxTxHxK = grow(q_BxTxHxK), grow(k_BxTxHxK), grow(v_BxTxHxK)
        q_pos_BxT, k_pos_BxT = more(q_pos_BxT), more(k_pos_BxT)
    rate = float(dropout.rate) if dropout.key is not None else 0.0
    seed = (jax.random.bits(dropout.key, (1,), jnp.uint32) if rate > 0 else jnp.zeros((1,), jnp.uint32))
    interpret = launch.interpret
    if interpret is None:
        interpret = interpreted()
        if interpret and "interpreter" not in _WARNED:
            _WARNED.add("interpreter")
            print(f"model.attention=pallas on {jax.default_backend()}: the kernel runs in Pallas' interpreter, "
                  f"which is for tests and very slow; use model.attention=auto here")
    config = _Config(block=block, rate=rate, interpret=interpret,
                     treedef=treedef, num_shared=len(shared), learned=bias is not None and bias.learned,
                     constant_beyond=None if bias is None else bias.constant_beyond,
                     lookup=None if bias is None or bias.table is None else bias.index)
    out = _flash(config, q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT.astype(jnp.int32),
                 k_pos_BxT.astype(jnp.int32), seed, ([_kernel_shape(x) for x in shared],
                                                     [_kernel_shape(x, per_head=True) for x in per_head]))
    return out[:, :t, :, :value_dim]


class _Config:
    """The static arguments of one call (hashable by identity, as custom_vjp needs nothing more)."""

    def __init__(self, block, rate, interpret, treedef, num_shared, learned, constant_beyond, lookup):
        self.block, self.rate, self.interpret, self.treedef, self.num_shared, self.learned = (
            block, rate, interpret, treedef, num_shared, learned)
        self.constant_beyond, self.lookup = constant_beyond, lookup

    @property
    def has_bias(self) -> bool:
        return self.treedef is not None or self.lookup is not None

    def _fn_leaves(self, leaves):
        """The leaves `fn` reads (all but the lookup table, which is the last)."""
        return leaves[:-1] if self.lookup is not None else leaves

    def _call(self, leaves, q_pos_Qx1, k_pos_1xS):
        shared_def, head_def, fn = self.treedef
        shared = jax.tree.unflatten(shared_def, leaves[:self.num_shared])
        head = jax.tree.unflatten(head_def, leaves[self.num_shared:])
        return fn(shared, head, q_pos_Qx1, k_pos_1xS).astype(jnp.float32)

    def _far(self, q_pos_Q, k_pos_S):
        return q_pos_Q.min() - k_pos_S.max() >= self.constant_beyond

    @staticmethod
    def _corner(q_pos_Q, k_pos_S):
        """One (query, key) pair of the tile, as 1 x 1 arrays (reductions: a kernel cannot slice)."""
        return jnp.reshape(q_pos_Q.min(), (1, 1)), jnp.reshape(k_pos_S.max(), (1, 1))

    def bias(self, leaves, leaf_refs, q_pos_Q, k_pos_S):
        """The bias of one tile, Q x S float32: `fn` (from one evaluation where the whole tile lies
        `constant_beyond` back, else elementwise) plus the table looked up at `index` (a gather
        from the table's ref)."""
        q_Qx1, k_1xS = q_pos_Q[:, None], k_pos_S[None, :]
        out = jnp.zeros((q_pos_Q.shape[0], k_pos_S.shape[0]), jnp.float32)
        if self.treedef is not None:
            full = lambda p: self._call(p, q_Qx1, k_1xS)
            if self.constant_beyond is None:
                out = full(self._fn_leaves(leaves))
            else:
                one = lambda p: jnp.broadcast_to(self._call(p, *self._corner(q_pos_Q, k_pos_S)), out.shape)
                out = jax.lax.cond(self._far(q_pos_Q, k_pos_S), one, full, self._fn_leaves(leaves))
        if self.lookup is not None:
            out = out + leaf_refs[-1][self.lookup(q_Qx1, k_1xS)]
        return out

    def bias_grads(self, leaves, q_pos_Q, k_pos_S, ds_QxS):
        """Every leaf's gradient from one tile's dS: the vjp of `fn`, and for the table one masked
        sum of dS per entry. A tile lying `constant_beyond` back needs only the sum of its dS. Each
        side of that choice takes its own vjp (a vjp through `lax.cond` leaves primitives that the
        GPU kernel cannot lower)."""
        q_Qx1, k_1xS = q_pos_Q[:, None], k_pos_S[None, :]
        entries = jnp.arange(leaves[-1].shape[0]) if self.lookup is not None else None

        def near(p):
            grads = [] if self.treedef is None else list(jax.vjp(lambda p: self._call(p, q_Qx1, k_1xS), p)[1](ds_QxS)[0])
            if self.lookup is not None:
                index, table = self.lookup(q_Qx1, k_1xS), jnp.zeros(entries.shape, jnp.float32)
                for n in range(entries.shape[0]):
                    table = table + jnp.where(entries == n, jnp.where(index == n, ds_QxS, 0.0).sum(), 0.0)
                grads.append(table)
            return grads
        if self.constant_beyond is None:
            return near(self._fn_leaves(leaves))

        def far(p):
            corner, total = self._corner(q_pos_Q, k_pos_S), ds_QxS.sum(keepdims=True)
            grads = [] if self.treedef is None else list(jax.vjp(lambda p: self._call(p, *corner), p)[1](total)[0])
            if self.lookup is not None:
                grads.append(jnp.where(entries == jnp.reshape(self.lookup(*corner), ()), total[0, 0], 0.0))
            return grads
        return jax.lax.cond(self._far(q_pos_Q, k_pos_S), far, near, self._fn_leaves(leaves))


def _kernel_shape(x: jax.Array, per_head: bool = False) -> jax.Array:
    """Leaves enter the kernel at least 1-d per head: H -> H x 1, () -> (1,)."""
    x = jnp.asarray(x, jnp.float32)
    return x.reshape(x.shape + (1,)) if x.ndim == int(per_head) else x


# ---- the dropout mask: a counter-based hash, the same in all three kernels ---------------------------

def _mix(x):
    """murmur3's 32-bit finaliser: a bijection of uint32 that mixes every input bit into every output bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def keep_mask(seed, sequence, head, num_heads, q_idx_Qx1, k_idx_1xS, rate: float):
    """True where dropout keeps the probability of (query index, key index) of one sequence and head."""
    stream = _mix(seed ^ _mix((sequence * num_heads + head).astype(jnp.uint32) + jnp.uint32(0x9E3779B9)))
    row = _mix(stream ^ (q_idx_Qx1.astype(jnp.uint32) * jnp.uint32(0x9E3779B1)))
    bits = _mix(row + k_idx_1xS.astype(jnp.uint32) * jnp.uint32(0x85EBCA77))
    return bits >= jnp.uint32(min(int(rate * 2.0 ** 32), 2 ** 32 - 1))


# ---- kernels --------------------------------------------------------------------------------------------

def _dot(a, b, contract=(1, 0)):
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                               preferred_element_type=jnp.float32)


def _logits(cfg, q, k, q_pos, k_pos, bias_leaves, tile, scale):
    """Tile (i, j)'s float32 logits, masked only on the diagonal (i == j), and where the bias is
    learned, the function from the tile's dS to the leaves' gradients. `bias_leaves`: (the leaves'
    values, their refs)."""
    (leaves, leaf_refs), (i, j) = bias_leaves, tile
    s = _dot(q, k, (1, 1)) * scale
    vjp = None
    if cfg.has_bias:
        s = s + cfg.bias(leaves, leaf_refs, q_pos, k_pos)
    if cfg.learned:
        vjp = lambda ds: cfg.bias_grads(leaves, q_pos, k_pos, ds)
    n = cfg.block
    causal = (i * n + jnp.arange(n))[:, None] >= (j * n + jnp.arange(n))[None, :]
    return jnp.where(causal | (i != j), s, NEG_INF), vjp


def _dropout(cfg, seed_ref, num_heads):
    """keep(i, j): the dropout mask of tile (i, j) of this program's sequence and head. The program
    ids are read here, at the kernel's top level (the interpreter has none inside loops)."""
    n, sequence, head = cfg.block, pl.program_id(0), pl.program_id(1)
    return lambda i, j: keep_mask(seed_ref[0], sequence, head, num_heads, (i * n + jnp.arange(n))[:, None],
                                  (j * n + jnp.arange(n))[None, :], cfg.rate)


def _forward_kernel(cfg, num_heads, scale, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, *refs):
    leaf_refs, (o_ref, lse_ref) = refs[:-2], refs[-2:]
    leaves = [r[...] for r in leaf_refs]
    n, i = cfg.block, pl.program_id(2)
    q, q_pos = q_ref[...], qp_ref[...]
    keep = _dropout(cfg, seed_ref, num_heads)

    def tile(j, carry):
        m, l, acc = carry
        k, v = k_ref[pl.ds(j * n, n), :], v_ref[pl.ds(j * n, n), :]
        s, _ = _logits(cfg, q, k, q_pos, kp_ref[pl.ds(j * n, n)], (leaves, leaf_refs), (i, j), scale)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp(s - m_new[:, None])
        correction = jnp.exp(m - m_new)
        if cfg.rate:
            p_used = jnp.where(keep(i, j), p * (1.0 / (1.0 - cfg.rate)), 0.0)
        else:
            p_used = p
        acc = acc * correction[:, None] + _dot(p_used.astype(v.dtype), v)
        return m_new, l * correction + p.sum(-1), acc

    init = (jnp.full((n,), NEG_INF, jnp.float32), jnp.zeros((n,), jnp.float32),
            jnp.zeros((n, q.shape[-1]), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, i + 1, tile, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def _dq_kernel(cfg, num_heads, scale, num_leaves, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, do_ref,
               lse_ref, delta_ref, *refs):
    leaf_refs, dq_ref, grad_refs = refs[:num_leaves], refs[num_leaves], refs[num_leaves + 1:]
    leaves = [r[...] for r in leaf_refs]
    n, i = cfg.block, pl.program_id(2)
    q, q_pos, do = q_ref[...], qp_ref[...], do_ref[...]
    keep = _dropout(cfg, seed_ref, num_heads)
    lse, delta = lse_ref[...], delta_ref[...]

    def tile(j, carry):
        dq, grads = carry
        k, v = k_ref[pl.ds(j * n, n), :], v_ref[pl.ds(j * n, n), :]
        s, vjp = _logits(cfg, q, k, q_pos, kp_ref[pl.ds(j * n, n)], (leaves, leaf_refs), (i, j), scale)
        p = jnp.exp(s - lse[:, None])
        dp = _dot(do, v, (1, 1))
        if cfg.rate:
            dp = jnp.where(keep(i, j), dp * (1.0 / (1.0 - cfg.rate)), 0.0)
        ds = p * (dp - delta[:, None])
        dq = dq + _dot(ds.astype(k.dtype), k)
        if vjp is not None:
            grads = [g + d for g, d in zip(grads, vjp(ds))]
        return dq, grads

    init = (jnp.zeros(q.shape, jnp.float32), [jnp.zeros(x.shape, jnp.float32) for x in leaves[:len(grad_refs)]])
    dq, grads = jax.lax.fori_loop(0, i + 1, tile, init)
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)
    for ref, g in zip(grad_refs, grads):
        ref[...] = g


def _dkv_kernel(cfg, num_heads, scale, num_blocks, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, do_ref,
                lse_ref, delta_ref, *refs):
    leaf_refs, (dk_ref, dv_ref) = refs[:-2], refs[-2:]
    leaves = [r[...] for r in leaf_refs]
    n, j = cfg.block, pl.program_id(2)
    k, v, k_pos = k_ref[...], v_ref[...], kp_ref[...]
    keep = _dropout(cfg, seed_ref, num_heads)

    def tile(i, carry):
        dk, dv = carry
        rows = pl.ds(i * n, n)
        q, do = q_ref[rows, :], do_ref[rows, :]
        s, _ = _logits(cfg, q, k, qp_ref[rows], k_pos, (leaves, leaf_refs), (i, j), scale)
        p = jnp.exp(s - lse_ref[rows][:, None])
        dp = _dot(do, v, (1, 1))
        if cfg.rate:
            kept = keep(i, j)
            p_used = jnp.where(kept, p * (1.0 / (1.0 - cfg.rate)), 0.0)
            dp = jnp.where(kept, dp * (1.0 / (1.0 - cfg.rate)), 0.0)
        else:
            p_used = p
        dv = dv + _dot(p_used.astype(do.dtype), do, (0, 0))
        ds = p * (dp - delta_ref[rows][:, None])
        return dk + _dot(ds.astype(q.dtype), q, (0, 0)), dv

    init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    dk, dv = jax.lax.fori_loop(j, num_blocks, tile, init)
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ---- pallas_call plumbing ----------------------------------------------------------------------------

def _specs(cfg, b, t, h, d, shared, per_head):
    """BlockSpecs on the grid (sequence, head, block): this block's rows, a head's whole sequence,
    positions, the dropout seed, and the bias's leaves (shared whole; per head, that head's slice)."""
    n = cfg.block
    rows = pl.BlockSpec((None, n, None, d), lambda s, hd, i: (s, i, hd, 0))
    whole = pl.BlockSpec((None, t, None, d), lambda s, hd, i: (s, 0, hd, 0))
    pos_rows = pl.BlockSpec((None, n), lambda s, hd, i: (s, i))
    pos_whole = pl.BlockSpec((None, t), lambda s, hd, i: (s, 0))
    stat_rows = pl.BlockSpec((None, None, n), lambda s, hd, i: (s, hd, i))
    stat_whole = pl.BlockSpec((None, None, t), lambda s, hd, i: (s, hd, 0))
    seed = pl.BlockSpec((1,), lambda s, hd, i: (0,))
    leaf_specs = ([pl.BlockSpec(x.shape, lambda s, hd, i, nd=x.ndim: (0,) * nd) for x in shared]
                  + [pl.BlockSpec((None, *x.shape[1:]), lambda s, hd, i, nd=x.ndim: (hd,) + (0,) * (nd - 1))
                     for x in per_head])
    return dict(rows=rows, whole=whole, pos_rows=pos_rows, pos_whole=pos_whole, stat_rows=stat_rows,
                stat_whole=stat_whole, seed=seed, leaves=leaf_specs)


def _forward(cfg, q, k, v, q_pos, k_pos, seed, bias_leaves):
    """The forward kernel: (out, log-sum-exp). `bias_leaves`: the bias's (shared, per-head) leaves."""
    shared, per_head = bias_leaves
    b, t, h, d = q.shape
    sp = _specs(cfg, b, t, h, d, shared, per_head)
    kernel = functools.partial(_forward_kernel, cfg, h, d ** -0.5)
    out, lse = pl.pallas_call(
        kernel, grid=(b, h, t // cfg.block),
        in_specs=[sp["rows"], sp["whole"], sp["whole"], sp["pos_rows"], sp["pos_whole"], sp["seed"], *sp["leaves"]],
        out_specs=[sp["rows"], sp["stat_rows"]],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, t), jnp.float32)],
        interpret=cfg.interpret, compiler_params=TRITON, name="attention_forward",
    )(q, k, v, q_pos, k_pos, seed, *shared, *per_head)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg, q, k, v, q_pos, k_pos, seed, bias_leaves):
    return _forward(cfg, q, k, v, q_pos, k_pos, seed, bias_leaves)[0]


def _flash_forward(cfg, q, k, v, q_pos, k_pos, seed, bias_leaves):
    out, lse = _forward(cfg, q, k, v, q_pos, k_pos, seed, bias_leaves)
    return out, (q, k, v, q_pos, k_pos, seed, bias_leaves, out, lse)


def _flash_backward(cfg, residuals, d_out):
    q, k, v, q_pos, k_pos, seed, (shared, per_head), out, lse = residuals
    b, t, h, d = q.shape
    nb = t // cfg.block
    sp = _specs(cfg, b, t, h, d, shared, per_head)
    leaves = [*shared, *per_head]
    delta = jnp.einsum("bthk,bthk->bht", d_out.astype(jnp.float32), out.astype(jnp.float32))
    d_out = d_out.astype(q.dtype)
    scale = d ** -0.5
    grad_shapes = _grad_shapes(b, h, nb, shared, per_head) if cfg.learned else []
    grad_specs = [pl.BlockSpec((None, None, None, *g.shape[3:]), lambda s, hd, i, nd=len(g.shape): (s, hd, i)
                               + (0,) * (nd - 3)) for g in grad_shapes]
    dq, *grads = pl.pallas_call(
        functools.partial(_dq_kernel, cfg, h, scale, len(leaves)), grid=(b, h, nb),
        in_specs=[sp["rows"], sp["whole"], sp["whole"], sp["pos_rows"], sp["pos_whole"], sp["seed"],
                  sp["rows"], sp["stat_rows"], sp["stat_rows"], *sp["leaves"]],
        out_specs=[sp["rows"], *grad_specs],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), *grad_shapes],
        interpret=cfg.interpret, compiler_params=TRITON, name="attention_backward_dq",
    )(q, k, v, q_pos, k_pos, seed, d_out, lse, delta, *leaves)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, cfg, h, scale, nb), grid=(b, h, nb),
        in_specs=[sp["whole"], sp["rows"], sp["rows"], sp["pos_whole"], sp["pos_rows"], sp["seed"],
                  sp["whole"], sp["stat_whole"], sp["stat_whole"], *sp["leaves"]],
        out_specs=[sp["rows"], sp["rows"]],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        interpret=cfg.interpret, compiler_params=TRITON, name="attention_backward_dkv",
    )(q, k, v, q_pos, k_pos, seed, d_out, lse, delta, *leaves)
    if cfg.learned:
        d_shared = [g.sum((0, 1, 2)) for g in grads[:len(shared)]]
        d_head = [g.sum((0, 2)) for g in grads[len(shared):]]
    else:
        d_shared, d_head = [jnp.zeros_like(x) for x in shared], [jnp.zeros_like(x) for x in per_head]
    zeros_int = lambda x: np.zeros(x.shape, jax.dtypes.float0)
    return (dq, dk, dv, zeros_int(q_pos), zeros_int(k_pos), zeros_int(seed), (d_shared, d_head))


def _grad_shapes(b, h, nb, shared, per_head):
    """Per (sequence, head, query block) partial gradients of every leaf, in its kernel shape."""
    return ([jax.ShapeDtypeStruct((b, h, nb, *x.shape), jnp.float32) for x in shared]
            + [jax.ShapeDtypeStruct((b, h, nb, *x.shape[1:]), jnp.float32) for x in per_head])


_flash.defvjp(_flash_forward, _flash_backward)
