"""Fused causal attention in Pallas (JAX's kernel language), with the positional bias computed
inside the kernel from positions, forward and backward (`model.attention=pallas`).

Flash attention's scheme (Dao et al. 2022): one program per (query block, sequence, head), the
query blocks on the grid's fastest axis, streams the key blocks up to the diagonal with an online
softmax in float32 (logits in base 2, exp2: log2(e) folded into the scale); the tiles above the
diagonal are never visited, and only the diagonal tile is masked. The backward pass recomputes each
tile's probabilities from the saved log-sum-exp (base 2): one kernel accumulates dQ (walking key
blocks), one accumulates dK and dV (walking query blocks), with dS = P * (dP - rowsum(dO * O)).

The bias is never materialised: a scheme provides `bias_fn()` (posenc.kernel_bias.BiasFunction), an
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
query index, key index), so the backward pass regenerates the same mask without storing it
(pallas_kernels.keep_mask: one hash per query and one per key, and 5 integer operations per logit).
A lookup table of any size (T5's buckets) is padded to a power of 2, as Triton's arrays must be.

On GPU the kernels lower through Triton, with the tiles, warps and pipelining stages of the forward
and of the backward kernels chosen for the device and the workload (models/attention/tuning.py);
head dimensions the compiled kernel cannot take (`head_dim_refusal`) are refused by its row in
paths.py, before it runs. Elsewhere they run in Pallas' interpreter (slow; what the CPU tests
use to check them against dense attention), so `auto` picks this path only on GPU, and only after
the kernel has passed its numerical check there (models/attention/verify.py). The kernels
themselves are in pallas_kernels.py.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from models.attention import pallas_kernels as kernels
from models.attention.dense import NO_DROPOUT, Dropout, padded_values
from posenc import Scheme

BLOCK = 64  # query and key rows per tile, where no search chose them (tuning.py)
HEAD_DIMS = (16, 256)  # the head dimensions the compiled kernel takes: powers of 2 in this range


@dataclasses.dataclass(frozen=True)
class Launch:
    """How the kernels run: query rows per tile (`block`) and key rows per tile (`key_block`, None:
    `block`), and on GPU Triton's warps per program and software-pipelining stages of the loop over
    tiles; `interpret`: whether in Pallas' interpreter (None: wherever the backend is not a GPU,
    `interpreted`); `backward`: the two backward kernels' own tiles, warps and stages (None: the
    forward's; its `interpret` and `backward` are not read). Chosen per device and workload by
    models/attention/tuning.py (the forward's and the backward's searched apart)."""
    block: int = BLOCK
    num_warps: int = 4
    num_stages: int = 2
    interpret: bool | None = None
    key_block: int | None = None
    backward: "Launch | None" = None

    @property
    def keys(self) -> int:
        """Key rows per tile."""
        return self.key_block or self.block

    @property
    def bwd(self) -> "Launch":
        """The backward kernels' configuration."""
        return self.backward or self

    def with_backward(self, backward: "Launch | None") -> "Launch":
        """This forward with `backward`'s tiles, warps and stages for the backward kernels (None
        where they are this configuration's own)."""
        same = backward is None or backward.tiles_label == self.tiles_label
        return dataclasses.replace(self, backward=None if same else dataclasses.replace(backward, backward=None))

    @property
    def tiles(self) -> tuple[int, ...]:
        """Every tile size of the three kernels (the sequence is padded to a multiple of the largest)."""
        return self.block, self.keys, self.bwd.block, self.bwd.keys

    @property
    def tiles_label(self) -> str:
        """This configuration's own tiles, warps and stages, in words."""
        tiles = f"block {self.block}" if self.keys == self.block else f"blocks {self.block} x {self.keys}"
        return f"{tiles}, {self.num_warps} warps, {self.num_stages} stages"

    @property
    def label(self) -> str:
        if self.backward is None or self.backward.tiles_label == self.tiles_label:
            return self.tiles_label
        return f"forward {self.tiles_label}; backward {self.backward.tiles_label}"

    def compiler_params(self):
        # Triton (not Mosaic GPU, JAX's other GPU backend for Pallas, which needs other kernels)
        return pl_triton.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def head_dim_refusal(head_dim: int) -> str | None:
    """Why the compiled (Triton) kernel cannot take heads of `head_dim` features, or None: Pallas'
    Triton lowering needs every array a power of 2 in size, Triton's matrix products need at least
    16 along the contracted axis, and above 256 a tile's float32 accumulators exceed a GPU's
    registers. (The interpreter takes any head dimension.)"""
    low, high = HEAD_DIMS
    if head_dim & (head_dim - 1) == 0 and low <= head_dim <= high:
        return None
    return (f"the Pallas kernel takes head dimensions that are powers of 2 from {low} to {high}, not "
            f"{head_dim}; use model.attention=auto (XLA's paths) or choose model.head_dim accordingly")


def per_device() -> bool:
    """Whether this is traced per device (inside `shard_map` over every axis of the mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and set(mesh.manual_axes) == set(mesh.axis_names)


def interpreted() -> bool:
    """Whether the kernels run in Pallas' interpreter here (everywhere but on GPU)."""
    return jax.default_backend() != "gpu"


_WARNED: set = set()


def pallas_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme,
                     dropout: Dropout = NO_DROPOUT, launch: Launch = Launch()) -> jax.Array:
    """Causal softmax(scale * q k^T / sqrt(K) + bias) v, equal to `dense_attention` up to float32
    rounding (with dropout: the same distribution, from the kernel's own mask). Queries attend to
    keys at or before their own index; positions feed only the bias. The decoder passes the
    device's `launch` (tuning.device_launch: on GPU the configuration its search chose). The schemes
    it expresses (a rotation, a per-query logit scale, a bias as `bias_fn`) are its row in paths.py."""
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    b, t, h, d = q_BxTxHxK.shape
    value_dim, v_BxTxHxK = v_BxTxHxK.shape[-1], padded_values(v_BxTxHxK, d)  # one head size in the kernel
    scale = scheme.logit_scale(q_pos_BxT, k_pos_BxT)
    if scale is not None:  # per query, B x H|1 x T x 1: (q * scale) . k == scale * (q . k)
        scale_BxTx1x1 = jnp.broadcast_to(scale, (b, 1, t, 1)).reshape(b, t, 1, 1)
        q_BxTxHxK = (q_BxTxHxK * scale_BxTx1x1).astype(k_BxTxHxK.dtype)
    bias = scheme.bias_fn()
    treedef, shared, per_head, by_distance, table_size = None, [], [], None, 0
    if bias is not None:
        shared, shared_def = jax.tree.flatten(bias.shared)
        per_head, head_def = jax.tree.flatten(bias.per_head)
        treedef = None if bias.fn is None else (shared_def, head_def, bias.fn)
        if bias.table is not None:  # the lookup table travels as the last per-head leaf, padded to a power
            table_size = bias.table.shape[-1]  # of 2 (Triton's arrays are; its gradient is cut back by the pad's)
            per_head = per_head + [jnp.pad(bias.table, ((0, 0), (0, _power_of_2(table_size) - table_size)))]
        by_distance = bias.by_distance()
        if by_distance is not None:  # then its values by distance (the forward's lookup), after it
            per_head = per_head + [by_distance]
    block = max(launch.tiles)  # all powers of 2: a multiple of every tile
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
    config = _Config(launch=dataclasses.replace(launch, interpret=interpret), rate=rate,
                     treedef=treedef, num_shared=len(shared), learned=bias is not None and bias.learned,
                     constant_beyond=None if bias is None else bias.constant_beyond,
                     lookup=None if bias is None or bias.table is None else bias.index,
                     by_distance=by_distance is not None, table_size=table_size)
    out = _flash_call(config, q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT.astype(jnp.int32),
                 k_pos_BxT.astype(jnp.int32), seed, ([_kernel_shape(x) for x in shared],
                                                     [_kernel_shape(x, per_head=True) for x in per_head]))
    return out[:, :t, :, :value_dim]


def _power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclasses.dataclass(frozen=True)  # equal by value: the layers of one shape share one traced kernel call
class _Config:
    """The static arguments of one call: the launch whose tiles the kernels use (`for_backward`: the
    backward kernels'), the dropout rate, and the bias's structure (`table_size`: the lookup table's
    real entries, before its padding)."""
    launch: Launch
    rate: float
    treedef: tuple | None
    num_shared: int
    learned: bool
    constant_beyond: int | None
    lookup: object | None
    by_distance: bool = False
    table_size: int = 0

    @property
    def block(self) -> int:
        return self.launch.block

    @property
    def key_block(self) -> int:
        return self.launch.keys

    @property
    def interpret(self) -> bool:
        return self.launch.interpret

    def for_backward(self) -> "_Config":
        """This configuration with the backward kernels' tiles, warps and stages."""
        return dataclasses.replace(self, launch=dataclasses.replace(self.launch.bwd, interpret=self.interpret,
                                                                    backward=None))

    @property
    def has_bias(self) -> bool:
        return self.treedef is not None or self.lookup is not None

    @property
    def _tables(self) -> int:
        """How many leaves at the end are tables: the lookup table, then its values by distance."""
        return (self.lookup is not None) + bool(self.by_distance)

    def _fn_leaves(self, leaves):
        """The leaves `fn` reads (all but the tables at the end)."""
        return leaves[:len(leaves) - self._tables]

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
        if self.by_distance:  # the table's values by distance: no index arithmetic per logit
            out = out + leaf_refs[-1][jnp.clip(q_Qx1 - k_1xS, 0, self.constant_beyond)]
        elif self.lookup is not None:
            out = out + leaf_refs[-1][self.lookup(q_Qx1, k_1xS)]
        return out

    def bias_grads(self, leaves, q_pos_Q, k_pos_S, ds_QxS):
        """Every leaf's gradient from one tile's dS: the vjp of `fn`, and for the table one masked
        sum of dS per entry. A tile lying `constant_beyond` back needs only the sum of its dS. Each
        side of that choice takes its own vjp (a vjp through `lax.cond` leaves primitives that the
        GPU kernel cannot lower)."""
        q_Qx1, k_1xS = q_pos_Q[:, None], k_pos_S[None, :]
        table = leaves[-1 - bool(self.by_distance)] if self.lookup is not None else None
        entries = jnp.arange(table.shape[0]) if table is not None else None
        by_distance = [jnp.zeros(leaves[-1].shape, jnp.float32)] if self.by_distance else []  # not differentiated

        def near(p):
            grads = [] if self.treedef is None else list(jax.vjp(lambda p: self._call(p, q_Qx1, k_1xS), p)[1](ds_QxS)[0])
            if self.lookup is not None:
                index, table = self.lookup(q_Qx1, k_1xS), jnp.zeros(entries.shape, jnp.float32)
                for n in range(self.table_size):  # the padding's entries are never read
                    table = table + jnp.where(entries == n, jnp.where(index == n, ds_QxS, 0.0).sum(), 0.0)
                grads.append(table)
            return grads + by_distance
        if self.constant_beyond is None:
            return near(self._fn_leaves(leaves))

        def far(p):
            corner, total = self._corner(q_pos_Q, k_pos_S), ds_QxS.sum(keepdims=True)
            grads = [] if self.treedef is None else list(jax.vjp(lambda p: self._call(p, *corner), p)[1](total)[0])
            if self.lookup is not None:
                grads.append(jnp.where(entries == jnp.reshape(self.lookup(*corner), ()), total[0, 0], 0.0))
            return grads + by_distance
        return jax.lax.cond(self._far(q_pos_Q, k_pos_S), far, near, self._fn_leaves(leaves))


def _kernel_shape(x: jax.Array, per_head: bool = False) -> jax.Array:
    """Leaves enter the kernel at least 1-d per head: H -> H x 1, () -> (1,)."""
    x = jnp.asarray(x, jnp.float32)
    return x.reshape(x.shape + (1,)) if x.ndim == int(per_head) else x


# ---- pallas_call plumbing ----------------------------------------------------------------------------

def _specs(n, b, t, h, d, shared, per_head):
    """BlockSpecs on the grid (block of n rows, sequence, head): this block's rows, a head's whole sequence,
    positions, the dropout seed, and the bias's leaves (shared whole; per head, that head's slice).
    The query (or key) blocks are the grid's first axis, the one a GPU launches fastest (as in jax's
    own Pallas attention), so that programs running side by side read the same head's keys and
    values from cache."""
    rows = pl.BlockSpec((None, n, None, d), lambda i, s, hd: (s, i, hd, 0))
    whole = pl.BlockSpec((None, t, None, d), lambda i, s, hd: (s, 0, hd, 0))
    pos_rows = pl.BlockSpec((None, n), lambda i, s, hd: (s, i))
    pos_whole = pl.BlockSpec((None, t), lambda i, s, hd: (s, 0))
    stat_rows = pl.BlockSpec((None, None, n), lambda i, s, hd: (s, hd, i))
    stat_whole = pl.BlockSpec((None, None, t), lambda i, s, hd: (s, hd, 0))
    seed = pl.BlockSpec((1,), lambda i, s, hd: (0,))
    leaf_specs = ([pl.BlockSpec(x.shape, lambda i, s, hd, nd=x.ndim: (0,) * nd) for x in shared]
                  + [pl.BlockSpec((None, *x.shape[1:]), lambda i, s, hd, nd=x.ndim: (hd,) + (0,) * (nd - 1))
                     for x in per_head])
    return dict(rows=rows, whole=whole, pos_rows=pos_rows, pos_whole=pos_whole, stat_rows=stat_rows,
                stat_whole=stat_whole, seed=seed, leaves=leaf_specs)


def _forward(cfg, q, k, v, q_pos, k_pos, seed, bias_leaves):
    """The forward kernel: (out, log-sum-exp). `bias_leaves`: the bias's (shared, per-head) leaves."""
    shared, per_head = bias_leaves
    b, t, h, d = q.shape
    sp = _specs(cfg.block, b, t, h, d, shared, per_head)
    kernel = functools.partial(kernels.forward_kernel, cfg, h, d ** -0.5)
    out, lse = pl.pallas_call(
        kernel, grid=(t // cfg.block, b, h),
        in_specs=[sp["rows"], sp["whole"], sp["whole"], sp["pos_rows"], sp["pos_whole"], sp["seed"], *sp["leaves"]],
        out_specs=[sp["rows"], sp["stat_rows"]],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, t), jnp.float32)],
        interpret=cfg.interpret, compiler_params=cfg.launch.compiler_params(), name="attention_forward",
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
    cfg = cfg.for_backward()
    b, t, h, d = q.shape
    nb = t // cfg.block
    sp, key_sp = _specs(cfg.block, b, t, h, d, shared, per_head), _specs(cfg.key_block, b, t, h, d, shared, per_head)
    leaves = [*shared, *per_head]
    delta = jnp.einsum("bthk,bthk->bht", d_out.astype(jnp.float32), out.astype(jnp.float32))
    d_out = d_out.astype(q.dtype)
    scale = d ** -0.5
    grad_shapes = _grad_shapes(b, h, nb, shared, per_head) if cfg.learned else []
    grad_specs = [pl.BlockSpec((None, None, None, *g.shape[3:]), lambda i, s, hd, nd=len(g.shape): (s, hd, i)
                               + (0,) * (nd - 3)) for g in grad_shapes]
    dq, *grads = pl.pallas_call(
        functools.partial(kernels.dq_kernel, cfg, h, scale, len(leaves)), grid=(nb, b, h),
        in_specs=[sp["rows"], sp["whole"], sp["whole"], sp["pos_rows"], sp["pos_whole"], sp["seed"],
                  sp["rows"], sp["stat_rows"], sp["stat_rows"], *sp["leaves"]],
        out_specs=[sp["rows"], *grad_specs],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), *grad_shapes],
        interpret=cfg.interpret, compiler_params=cfg.launch.compiler_params(), name="attention_backward_dq",
    )(q, k, v, q_pos, k_pos, seed, d_out, lse, delta, *leaves)
    dk, dv = pl.pallas_call(
        functools.partial(kernels.dkv_kernel, cfg, h, scale, nb), grid=(t // cfg.key_block, b, h),
        in_specs=[key_sp["whole"], key_sp["rows"], key_sp["rows"], key_sp["pos_whole"], key_sp["pos_rows"],
                  key_sp["seed"], key_sp["whole"], key_sp["stat_whole"], key_sp["stat_whole"], *key_sp["leaves"]],
        out_specs=[key_sp["rows"], key_sp["rows"]],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        interpret=cfg.interpret, compiler_params=cfg.launch.compiler_params(), name="attention_backward_dkv",
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
# Every call of one static config and shapes is the same traced function: a model's layers (48 calls of
# the paper step, 3 distinct bodies) lower and compile their kernels once, called from each layer.
_flash_call = jax.jit(_flash, static_argnums=(0,))
