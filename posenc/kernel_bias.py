"""The kernel-bias contract: an additive logits bias given as a function of positions, which a fused
kernel evaluates tile by tile (models/attention/pallas.py) instead of reading a materialised bias.
A scheme whose traits say `bias="function"` returns one from `bias_fn()`."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class BiasFunction:
    """An additive logits bias as a function of positions, for kernels that compute it tile by tile
    and never materialise it (models/attention/pallas.py).

    `fn(shared, head, q_pos_Qx1, k_pos_1xS) -> Q x S` (float32) is the bias of one head: `shared`
    is the pytree `shared` as given, `head` the pytree `per_head` with every leaf sliced at one head
    (each `per_head` leaf has a leading axis of length num_heads). Leaves reach `fn` at least 1-d
    (a scalar as shape (1,), one head's scalar as (1,)), so write `fn` with broadcasting. `fn` must
    be elementwise arithmetic on its position arguments and depend on the leaves only (not on
    arrays it closes over; Python numbers are fine): it runs inside a GPU kernel, which cannot
    gather, reduce over keys or index into a vector, so a vector of coefficients is given as a
    tuple of leaves, one per element (tests/models/attention/test_pallas.py lowers every scheme's). Where
    `learned`, the kernel returns the leaves' gradients, through which the scheme's parameters get
    theirs; parameter-free biases set it False and skip that work. A learned lookup table (T5's
    buckets) goes in `table` with its elementwise `index` function instead of `fn` (or beside it):
    kernels gather it, and sum dS per entry for its gradient. `constant_beyond` = D says that the
    bias is one value per head wherever q_pos - k_pos >= D (T5's last bucket): a tile lying wholly
    that far back is then filled from one evaluation, and its gradient is one sum. `relative_index`
    says that `index` depends on q_pos - k_pos alone (T5's buckets): with `constant_beyond` set, a
    kernel then reads the table's values per distance, table[index(d, 0)] for d = 0 .. D (made once
    per call), at clip(q_pos - k_pos, 0, D): no index arithmetic (T5's logarithm) per logit in the
    forward pass (the gradient still sums dS per entry of `table`).
    """
    fn: Callable | None
    shared: Any = ()
    per_head: Any = ()
    learned: bool = True
    constant_beyond: int | None = None
    table: jax.Array | None = None   # H x N: plus table[head, index(q_pos_Qx1, k_pos_1xS)] (int32
    index: Callable | None = None    # Q x S in [0, N)), which a kernel gathers from memory
    relative_index: bool = False

    def by_distance(self) -> jax.Array | None:
        """H x N: the table's value at each causal distance 0 .. D = constant_beyond, then D's value
        again up to N, the next power of 2 (Triton's arrays are powers of 2 long); None unless
        `relative_index` and `constant_beyond`. Not differentiated: `table` gets its gradient from the
        kernel's sums per entry."""
        if self.table is None or not self.relative_index or self.constant_beyond is None:
            return None
        size = 1 << self.constant_beyond.bit_length()  # > D: D + 1 entries fit
        distances = jnp.minimum(jnp.arange(size, dtype=jnp.int32), self.constant_beyond)[:, None]
        index_D = self.index(distances, jnp.zeros((1, 1), jnp.int32))[:, 0]
        return jax.lax.stop_gradient(self.table[:, index_D])

    def dense(self, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> jax.Array:
        """The whole bias, B x H x T x S, one head at a time (to check `fn` against `Scheme.bias`)."""
        lift = lambda x: jnp.reshape(x, (1,)) if jnp.ndim(x) == 0 else x
        shared = jax.tree.map(lift, self.shared)
        if self.table is not None:
            num_heads = self.table.shape[0]
        else:
            num_heads = len(jax.tree.leaves(self.per_head)[0]) if jax.tree.leaves(self.per_head) else 1
        heads = []
        for h in range(num_heads):
            head = jax.tree.map(lambda x: lift(x[h]), self.per_head)

            def one(q, k):
                out = jnp.zeros((q.shape[0], k.shape[0]), jnp.float32)
                if self.fn is not None:
                    out = out + self.fn(shared, head, q[:, None], k[None, :])
                if self.table is not None:
                    out = out + self.table[h][self.index(q[:, None], k[None, :])]
                return out
            heads.append(jax.vmap(one)(q_pos_BxT, k_pos_BxS))
        return jnp.stack(heads, axis=1).astype(jnp.float32)
