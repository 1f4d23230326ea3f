"""The three kernels of the Pallas attention (models/attention/pallas.py holds the call, the bias
and the launch): the forward pass with an online softmax, the dQ pass (walking key blocks, with the
bias parameters' partial gradients) and the dK / dV pass (walking query blocks), and the dropout
mask they share. Each kernel is a function of one program's refs, on the grid (block, sequence,
head); `cfg` is pallas._Config.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from models.attention.dense import NEG_INF

LOG2E = 1.4426950408889634  # log2(e): the logits are kept in base-2 units, exp(x) = exp2(x * LOG2E)


# ---- the dropout mask: a counter-based hash, the same in all three kernels ---------------------------

def _mix(x):
    """murmur3's 32-bit finaliser: a bijection of uint32 that mixes every input bit into every output bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def keep_mask(seed, sequence, head, num_heads, q_idx_Qx1, k_idx_1xS, rate: float):
    """True where dropout keeps the probability of (query index, key index) of one sequence and head.

    A full hash per query (Q x 1) and per key (1 x S), both from the (seed, sequence, head) stream, so
    that their cost is spread over a tile's row or column; per logit only their xor, a multiply, an
    xor-shift and a multiply (the comparison reads the top bits, which the last multiply fills from
    every bit), 5 integer operations where a full hash per logit took 10. One multiply alone leaves
    pairs of rows whose masks correlate (tests/models/attention/test_dropout_mask.py measures the
    correlations, the keep rate and 2 x 2 parities against independent draws). Each key is kept with
    probability exactly 1 - rate (to 2^-32): the product of a uniform word by an odd constant is uniform."""
    stream = _mix(seed ^ _mix((sequence * num_heads + head).astype(jnp.uint32) + jnp.uint32(0x9E3779B9)))
    row = _mix(stream ^ (q_idx_Qx1.astype(jnp.uint32) * jnp.uint32(0x9E3779B1)))
    column = _mix((stream + jnp.uint32(0x632BE5AB)) ^ (k_idx_1xS.astype(jnp.uint32) * jnp.uint32(0x85EBCA77)))
    bits = (row ^ column) * jnp.uint32(0x9E3779B1)
    bits = (bits ^ (bits >> 16)) * jnp.uint32(0x85EBCA6B)
    return bits >= jnp.uint32(min(int(rate * 2.0 ** 32), 2 ** 32 - 1))


# ---- kernels --------------------------------------------------------------------------------------------

def _dot(a, b, contract=(1, 0)):
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                               preferred_element_type=jnp.float32)


def _logits(cfg, q, k, q_pos, k_pos, bias_leaves, tile, scale):
    """Tile (i, j)'s float32 logits times log2(e), keys after their query masked (query tiles of
    cfg.block rows, key tiles of cfg.key_block), and where the
    bias is learned, the function from the tile's dS (the gradient of the natural logits) to the
    leaves' gradients. `bias_leaves`: (the leaves' values, their refs). The kernels take exp2 of
    these base-2 logits (the GPU's native exponential; exp is a multiply by log2(e) and exp2): the
    multiply is folded into the scale, and where there is a bias, moved onto it."""
    (leaves, leaf_refs), (i, j) = bias_leaves, tile
    s = _dot(q, k, (1, 1)) * (scale * LOG2E)
    vjp = None
    if cfg.has_bias:
        s = s + cfg.bias(leaves, leaf_refs, q_pos, k_pos) * LOG2E
    if cfg.learned:
        vjp = lambda ds: cfg.bias_grads(leaves, q_pos, k_pos, ds)
    nq, nk = cfg.block, cfg.key_block
    causal = (i * nq + jnp.arange(nq))[:, None] >= (j * nk + jnp.arange(nk))[None, :]
    return jnp.where(causal, s, NEG_INF), vjp


def _dropout(cfg, seed_ref, num_heads):
    """keep(i, j): the dropout mask of tile (i, j) (query tile i, key tile j) of this program's
    sequence and head, a function of the absolute indices (the same mask whatever the tile sizes).
    The program ids are read here, at the kernel's top level (the interpreter has none inside loops)."""
    nq, nk, sequence, head = cfg.block, cfg.key_block, pl.program_id(1), pl.program_id(2)
    return lambda i, j: keep_mask(seed_ref[0], sequence, head, num_heads, (i * nq + jnp.arange(nq))[:, None],
                                  (j * nk + jnp.arange(nk))[None, :], cfg.rate)


def _key_tiles_to_diagonal(i, nq: int, nk: int):
    """How many key tiles of nk keys query tile i (of nq rows) reaches: through its last row's key."""
    return ((i + 1) * nq + nk - 1) // nk


def forward_kernel(cfg, num_heads, scale, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, *refs):
    leaf_refs, (o_ref, lse_ref) = refs[:-2], refs[-2:]
    leaves = [r[...] for r in leaf_refs]
    nq, nk, i = cfg.block, cfg.key_block, pl.program_id(0)
    q, q_pos = q_ref[...], qp_ref[...]
    keep = _dropout(cfg, seed_ref, num_heads)

    def tile(j, carry):
        m, l, acc = carry
        k, v = k_ref[pl.ds(j * nk, nk), :], v_ref[pl.ds(j * nk, nk), :]
        s, _ = _logits(cfg, q, k, q_pos, kp_ref[pl.ds(j * nk, nk)], (leaves, leaf_refs), (i, j), scale)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp2(s - m_new[:, None])
        correction = jnp.exp2(m - m_new)
        if cfg.rate:
            p_used = jnp.where(keep(i, j), p * (1.0 / (1.0 - cfg.rate)), 0.0)
        else:
            p_used = p
        acc = acc * correction[:, None] + _dot(p_used.astype(v.dtype), v)
        return m_new, l * correction + p.sum(-1), acc

    init = (jnp.full((nq,), NEG_INF, jnp.float32), jnp.zeros((nq,), jnp.float32),
            jnp.zeros((nq, q.shape[-1]), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, _key_tiles_to_diagonal(i, nq, nk), tile, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(l)  # in base-2 units, as the backward kernels read it


def dq_kernel(cfg, num_heads, scale, num_leaves, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, do_ref,
               lse_ref, delta_ref, *refs):
    leaf_refs, dq_ref, grad_refs = refs[:num_leaves], refs[num_leaves], refs[num_leaves + 1:]
    leaves = [r[...] for r in leaf_refs]
    nq, nk, i = cfg.block, cfg.key_block, pl.program_id(0)
    q, q_pos, do = q_ref[...], qp_ref[...], do_ref[...]
    keep = _dropout(cfg, seed_ref, num_heads)
    lse, delta = lse_ref[...], delta_ref[...]

    def tile(j, carry):
        dq, grads = carry
        k, v = k_ref[pl.ds(j * nk, nk), :], v_ref[pl.ds(j * nk, nk), :]
        s, vjp = _logits(cfg, q, k, q_pos, kp_ref[pl.ds(j * nk, nk)], (leaves, leaf_refs), (i, j), scale)
        p = jnp.exp2(s - lse[:, None])
        dp = _dot(do, v, (1, 1))
        if cfg.rate:
            dp = jnp.where(keep(i, j), dp * (1.0 / (1.0 - cfg.rate)), 0.0)
        ds = p * (dp - delta[:, None])
        dq = dq + _dot(ds.astype(k.dtype), k)
        if vjp is not None:
            grads = [g + d for g, d in zip(grads, vjp(ds))]
        return dq, grads

    init = (jnp.zeros(q.shape, jnp.float32), [jnp.zeros(x.shape, jnp.float32) for x in leaves[:len(grad_refs)]])
    dq, grads = jax.lax.fori_loop(0, _key_tiles_to_diagonal(i, nq, nk), tile, init)
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)
    for ref, g in zip(grad_refs, grads):
        ref[...] = g


def dkv_kernel(cfg, num_heads, scale, num_blocks, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, do_ref,
                lse_ref, delta_ref, *refs):
    """One program per key tile j (cfg.key_block keys), walking the query tiles from the first that
    reaches it; `num_blocks`: the query tiles of the sequence."""
    leaf_refs, (dk_ref, dv_ref) = refs[:-2], refs[-2:]
    leaves = [r[...] for r in leaf_refs]
    nq, nk, j = cfg.block, cfg.key_block, pl.program_id(0)
    k, v, k_pos = k_ref[...], v_ref[...], kp_ref[...]
    keep = _dropout(cfg, seed_ref, num_heads)

    def tile(i, carry):
        dk, dv = carry
        rows = pl.ds(i * nq, nq)
        q, do = q_ref[rows, :], do_ref[rows, :]
        s, _ = _logits(cfg, q, k, qp_ref[rows], k_pos, (leaves, leaf_refs), (i, j), scale)
        p = jnp.exp2(s - lse_ref[rows][:, None])
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
    dk, dv = jax.lax.fori_loop(j * nk // nq, num_blocks, tile, init)
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
