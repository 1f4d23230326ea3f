"""The three kernels of the Pallas attention (models/attention/pallas.py holds the call, the bias
and the launch): the forward pass with an online softmax, the dQ pass (walking key blocks, with the
bias parameters' partial gradients) and the dK / dV pass (walking query blocks), and the dropout
mask they share. Each kernel is a function of one program's refs; `cfg` is pallas._Config.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from models.attention.dense import NEG_INF


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


def forward_kernel(cfg, num_heads, scale, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, *refs):
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


def dq_kernel(cfg, num_heads, scale, num_leaves, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, do_ref,
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


def dkv_kernel(cfg, num_heads, scale, num_blocks, q_ref, k_ref, v_ref, qp_ref, kp_ref, seed_ref, do_ref,
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
