"""Schemes whose logits bias depends on content (the query or key vectors), not only on positions.

Every bias here is computed for one (query block, key block) tile from that tile's q, k and
positions, so blockwise attention can call it per tile. None of them materialises a T x T x d
tensor: the clipped tables (Shaw, DeBERTa) are multiplied by the queries once per table row
(B x H x Tq x rows) and then gathered by distance (DeBERTa: where no distance is clipped, only the
rows of the tile's distances, read along diagonals without a gather); Transformer-XL's sinusoidal term is split with
the angle-difference identity into a per-query and a per-key feature (exact for any positions).
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from posenc import fast_form
from posenc.base import ModelDims, Scheme, check_table_length
from posenc.bias import t5_relative_position_bucket
from posenc.options.content import DebertaOptions, ShawOptions, TransformerXLOptions, TupeOptions
from posenc.registry import register
from posenc.traits import Traits


def _gather_rows(scores_BxHxTxR: jax.Array, index_BxTxS: jax.Array) -> jax.Array:
    """out[b, h, t, s] = scores[b, h, t, index[b, t, s]]: per-row table products -> one tile."""
    b, h, t, _ = scores_BxHxTxR.shape
    index_BxHxTxS = jnp.broadcast_to(index_BxTxS[:, None], (b, h, t, index_BxTxS.shape[-1]))
    return jnp.take_along_axis(scores_BxHxTxR, index_BxHxTxS, axis=-1)


def _skewed(products_BxHxAxW: jax.Array, cols: int) -> jax.Array:
    """out[b, h, a, c] = products[b, h, a, (A - 1) - a + c], W = A + cols - 1: each row a slice of its
    row of products, the slices moving one left per row. Read flat from the products padded by one
    column, in rows of W: static slices and reshapes, no gather (whose gradient, a scatter, is slow
    on a CPU)."""
    b, h, a, w = products_BxHxAxW.shape
    flat = jnp.pad(products_BxHxAxW, [(0, 0), (0, 0), (0, 0), (0, 1)]).reshape(b, h, a * (w + 1))
    return flat[:, :, a - 1:a - 1 + a * w].reshape(b, h, a, w)[..., :cols]


def _relative_products(x_BxAxHxK: jax.Array, rel_RxHxK: jax.Array, pos_a_BxA: jax.Array, pos_c_BxC: jax.Array,
                       sign: int, low: int, high: int) -> jax.Array:
    """out[b, h, a, c] = x[b, a, h] . rel[clip(sign * (pos_a[a] - pos_c[c]), low, high) - low, h], float32:
    the relative-position terms of DeBERTa (c2p with the queries, p2c with the keys).

    Where every row has the same positions, each contiguous, and no distance is clipped (training,
    and evaluation up to the clipping distance), the rows of `rel` used are the A + C - 1 around the
    diagonal: only those are multiplied (2k = 1,024 -> 511 at L = 256) and the lookup, which then
    runs along diagonals, is `_skewed`. Otherwise every row of `rel` is multiplied and gathered.
    Chosen at run time (posenc/fast_form.py)."""
    x = x_BxAxHxK.astype(jnp.float32)
    a, c = pos_a_BxA.shape[1], pos_c_BxC.shape[1]
    pa, pc = pos_a_BxA.astype(jnp.int32), pos_c_BxC.astype(jnp.int32)

    def gathered():
        products_BxHxAxR = jnp.einsum("bahk,rhk->bhar", x, rel_RxHxK)
        return _gather_rows(products_BxHxAxR, jnp.clip(sign * (pa[:, :, None] - pc[:, None, :]), low, high) - low)

    width = a + c - 1
    if width > rel_RxHxK.shape[0]:
        return gathered()
    first_a, first_c = pa[0, 0], pc[0, 0]
    contiguous = (fast_form.rows_alike(pa, pc) & jnp.all(pa[0] == first_a + jnp.arange(a, dtype=jnp.int32))
                  & jnp.all(pc[0] == first_c + jnp.arange(c, dtype=jnp.int32)))
    distances = sign * jnp.stack([first_a - first_c - (c - 1), first_a + (a - 1) - first_c])
    unclipped = (distances.min() >= low) & (distances.max() <= high)

    def skewed():
        # index(a, c) = start + sign * (a - c); its lowest over the tile is `lowest`; the rows used,
        # read so that their local index is (A - 1) - a + c (reversed for sign = +1)
        start = sign * (first_a - first_c) - low
        lowest = start - (c - 1 if sign > 0 else a - 1)
        window = jax.lax.dynamic_slice_in_dim(rel_RxHxK, lowest, width, 0)
        window = jnp.flip(window, 0) if sign > 0 else window
        return _skewed(jnp.einsum("bahk,whk->bhaw", x, window), c)

    return fast_form.choose(contiguous & unclipped, skewed, gathered)


def _sum_by_row(probs_BxHxTxS: jax.Array, index_BxTxS: jax.Array, rows: int) -> jax.Array:
    """w[b, h, t, r] = sum over s with index[b, t, s] == r of probs[b, h, t, s] (linear in probs)."""
    b, h, t, s = probs_BxHxTxS.shape
    bi = jnp.arange(b)[:, None, None, None]
    hi = jnp.arange(h)[None, :, None, None]
    ti = jnp.arange(t)[None, None, :, None]
    ri = index_BxTxS[:, None, :, :]
    return jnp.zeros((b, h, t, rows), probs_BxHxTxS.dtype).at[bi, hi, ti, ri].add(probs_BxHxTxS)


# --- Shaw et al. 2018 ---------------------------------------------------------------------------

@register("shaw")
class Shaw(Scheme):
    """Relative position representations: learned vectors per clipped distance in keys and values.

        e_ij = q_i (k_j + R^K[clip(j - i, -k, k)])^T / sqrt(d),   z_i = sum_j a_ij (v_j + R^V[clip(j - i, -k, k)])

    Shaw, Uszkoreit & Vaswani, "Self-Attention with Relative Position Representations", NAACL 2018.
    R^K, R^V are (2k + 1) x head_dim, shared by the heads and different in every layer (as in the
    paper; `per_layer`). The bias is q_i . R^K[...] / sqrt(d): it is added after attention's
    1/sqrt(d), so the scale is applied here. Distances beyond k share the edge rows, so any length
    can be evaluated. The value term sums the tile's probabilities per clipped distance (a
    B x H x Tq x (2k+1) tensor) before multiplying by R^V: linear in the probabilities, as
    blockwise attention requires.
    """
    family = "relative"
    citation = "Shaw et al. 2018"
    extrapolates = "yes"
    Options = ShawOptions
    traits = Traits(per_layer=True, bias="tile", value_term=True)

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        self.traits = self.traits.replace(value_term=options.value_term)
        if options.max_relative_position < 0:
            raise ValueError(f"shaw.max_relative_position must be >= 0, got {options.max_relative_position}")
        rows = 2 * options.max_relative_position + 1
        init = nnx.initializers.normal(stddev=0.02)
        self.key_table = nnx.Param(init(rngs.params(), (rows, dims.head_dim), jnp.float32))
        self.value_table = nnx.Param(init(rngs.params(), (rows, dims.head_dim), jnp.float32))

    def _index(self, q_pos_BxT, k_pos_BxS) -> jax.Array:
        k = self.options.max_relative_position
        distance_BxTxS = k_pos_BxS[:, None, :].astype(jnp.int32) - q_pos_BxT[:, :, None].astype(jnp.int32)
        return jnp.clip(distance_BxTxS, -k, k) + k

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        scores_BxHxTxR = jnp.einsum("bthk,rk->bhtr", q_BxTxHxK.astype(jnp.float32), self.key_table[...])
        return _gather_rows(scores_BxHxTxR, self._index(q_pos_BxT, k_pos_BxS)) * self.dims.head_dim ** -0.5

    def value_bias(self, probs_BxHxTxS, q_pos_BxT, k_pos_BxS):
        if not self.options.value_term:
            return None
        rows = 2 * self.options.max_relative_position + 1
        weights_BxHxTxR = _sum_by_row(probs_BxHxTxS.astype(jnp.float32), self._index(q_pos_BxT, k_pos_BxS), rows)
        return jnp.einsum("bhtr,rk->bthk", weights_BxHxTxR, self.value_table[...])


# --- Transformer-XL (Dai et al. 2019) ------------------------------------------------------------

def txl_inverse_frequencies(d_model: int, base: float = 10000.0) -> jax.Array:
    """omega_f = base^(-2f / d_model), f = 0 .. d_model/2 - 1 (R_r = [sin(r omega), cos(r omega)])."""
    return base ** (-2.0 * jnp.arange(d_model // 2, dtype=jnp.float32) / d_model)


@register("transformer_xl")
class TransformerXL(Scheme):
    """Transformer-XL's relative attention, terms (b), (c), (d) of

        A_ij = q_i k_j^T  +  q_i (W_R R_{i-j})^T  +  u k_j^T  +  v (W_R R_{i-j})^T,   all / sqrt(d)

    Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context", ACL 2019
    (also XLNet). R_r = [sin(r omega), cos(r omega)] (d_model wide, omega as `txl_inverse_frequencies`),
    W_R: d_model -> heads x head_dim, u, v per head; each layer has its own W_R, u, v (`per_layer`,
    the released models' untied setting). Terms (b) + (d) = (q_i + v) W_R R_{i-j}: with g = W_R^T (q_i + v)
    split into its sin and cos halves, the angle-difference identity gives
        sum_f cos(j w_f) [g_s sin(i w_f) + g_c cos(i w_f)] + sin(j w_f) [g_c sin(i w_f) - g_s cos(i w_f)],
    a dot product of a per-query and a per-key feature: exact for any positions, per tile, no Tq x Tk x d
    tensor. Positions are taken relative to the tile's first query (which leaves i - j unchanged) to
    keep the float32 angles small. R is defined at every distance, so any length can be evaluated.
    The segment-level recurrence (memory) of Transformer-XL is not part of a positional scheme.
    """
    family = "relative"
    citation = "Dai et al. 2019"
    extrapolates = "partly"
    Options = TransformerXLOptions
    traits = Traits(per_layer=True, bias="tile")

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if dims.d_model % 2:
            raise ValueError(f"transformer_xl needs an even d_model, got {dims.d_model}")
        w_init = nnx.initializers.normal(stddev=dims.d_model ** -0.5)
        self.w_r = nnx.Param(w_init(rngs.params(), (dims.d_model, dims.num_heads, dims.head_dim), jnp.float32))
        init = nnx.initializers.normal(stddev=0.02)
        self.u = nnx.Param(init(rngs.params(), (dims.num_heads, dims.head_dim), jnp.float32))
        self.v = nnx.Param(init(rngs.params(), (dims.num_heads, dims.head_dim), jnp.float32))

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        omega_F = txl_inverse_frequencies(self.dims.d_model, self.options.base)
        f = omega_F.shape[0]
        origin_Bx1 = q_pos_BxT[:, :1]
        q_angle_BxTxF = (q_pos_BxT - origin_Bx1).astype(jnp.float32)[..., None] * omega_F
        k_angle_BxSxF = (k_pos_BxS - origin_Bx1).astype(jnp.float32)[..., None] * omega_F
        g_BxTxHxD = jnp.einsum("bthk,dhk->bthd", q_BxTxHxK.astype(jnp.float32) + self.v[...], self.w_r[...])
        g_sin, g_cos = g_BxTxHxD[..., :f], g_BxTxHxD[..., f:]
        sin_q, cos_q = jnp.sin(q_angle_BxTxF)[:, :, None], jnp.cos(q_angle_BxTxF)[:, :, None]
        query_BxTxHxD = jnp.concatenate([g_sin * sin_q + g_cos * cos_q, g_cos * sin_q - g_sin * cos_q], -1)
        key_BxSxD = jnp.concatenate([jnp.cos(k_angle_BxSxF), jnp.sin(k_angle_BxSxF)], -1)
        position_BxHxTxS = jnp.einsum("bthd,bsd->bhts", query_BxTxHxD, key_BxSxD)
        content_bias_BxHx1xS = jnp.einsum("hk,bshk->bhs", self.u[...], k_BxSxHxK.astype(jnp.float32))[:, :, None]
        return (position_BxHxTxS + content_bias_BxHx1xS) * self.dims.head_dim ** -0.5


# --- DeBERTa (He et al. 2021) --------------------------------------------------------------------

@register("deberta")
class Deberta(Scheme):
    """DeBERTa's disentangled attention: content-to-content + content-to-position + position-to-content,

        A_ij = (Q^c_i K^c_j^T + Q^c_i K^r_{delta(i,j)}^T + K^c_j Q^r_{delta(i,j)}^T) / sqrt(3d),
        delta(i, j) = clip(i - j, -k, k - 1) + k  in [0, 2k),  Q^r = P W_{q,r},  K^r = P W_{k,r}.

    Position-to-content index: the default (`p2c_index=code`) is the released code's
    (microsoft/DeBERTa `disentangled_att_bias`: p2c gathered at clamp(-(j - i) + k) on the key's
    row, then transposed, i.e. delta(i, j) as for c2p); the paper's Eq. 4 writes delta(j, i), which
    `p2c_index=paper` gives. Published DeBERTa numbers come from the code.

    He, Liu, Gao & Chen, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention", ICLR 2021.
    Scaling: attention already divides q.k by sqrt(d); `logit_scale` multiplies that by 1/sqrt(3), so
    the content term is q.k / sqrt(3d), and the bias returns (c2p + p2c) / sqrt(3d): exactly the
    paper's single 1/sqrt(3d). P (2k x d_model) and W_{q,r}, W_{k,r} (d_model -> heads x head_dim,
    no bias). In the paper P is shared by all layers and the projections are per layer; hooks cannot
    tell layers apart, so here every layer has its own P and projections (`per_layer`, a superset).
    The enhanced mask decoder (absolute positions for masked-token prediction) belongs to masked LM
    pre-training and is left out. Distances beyond k share the edge rows: any length can be evaluated.
    """
    family = "relative"
    citation = "He et al. 2021"
    extrapolates = "yes"
    Options = DebertaOptions
    # not bias_work_per_key: p2c multiplies each row tile's keys again, but since only the tile's distances
    # are multiplied (`_relative_products`) triangular trains faster than dense (benchmark model, 2 CPU
    # cores, in-process A/B, 3 rounds: 373-454 against 485-601 ms a step; 2026-11-27)
    traits = Traits(per_layer=True, bias="tile", logit_scale="per_query")

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if options.max_relative_positions < 1:
            raise ValueError(f"deberta.max_relative_positions must be >= 1, got {options.max_relative_positions}")
        if options.p2c_index not in ("code", "paper"):
            raise ValueError(f"deberta.p2c_index must be 'code' or 'paper', got {options.p2c_index!r}")
        rows = 2 * options.max_relative_positions
        self.table = nnx.Param(nnx.initializers.normal(stddev=0.02)(rngs.params(), (rows, dims.d_model), jnp.float32))
        w_init = nnx.initializers.normal(stddev=dims.d_model ** -0.5)
        shape = (dims.d_model, dims.num_heads, dims.head_dim)
        self.w_q = nnx.Param(w_init(rngs.params(), shape, jnp.float32))
        self.w_k = nnx.Param(w_init(rngs.params(), shape, jnp.float32))

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        table_RxD = self.table[...]
        key_rel_RxHxK = jnp.einsum("rd,dhk->rhk", table_RxD, self.w_k[...])
        query_rel_RxHxK = jnp.einsum("rd,dhk->rhk", table_RxD, self.w_q[...])
        k = self.options.max_relative_positions  # delta(a, b) = clip(a - b, -k, k - 1) + k
        c2p_BxHxTxS = _relative_products(q_BxTxHxK, key_rel_RxHxK, q_pos_BxT, k_pos_BxS, +1, -k, k - 1)
        # p2c gathered on the key's row: delta(i, j) at [j, i] (the code's), or delta(j, i) (the paper's)
        sign = -1 if self.options.p2c_index == "code" else +1
        p2c_BxHxSxT = _relative_products(k_BxSxHxK, query_rel_RxHxK, k_pos_BxS, q_pos_BxT, sign, -k, k - 1)
        p2c_BxHxTxS = jnp.swapaxes(p2c_BxHxSxT, -1, -2)
        return (c2p_BxHxTxS + p2c_BxHxTxS) * (3 * self.dims.head_dim) ** -0.5

    def logit_scale(self, q_pos_BxT, k_pos_BxS):
        return jnp.asarray(3.0 ** -0.5, jnp.float32)


# --- TUPE (Ke, He & Liu 2021) --------------------------------------------------------------------

@register("tupe")
class Tupe(Scheme):
    """Transformer with Untied Positional Encoding (TUPE-R):

        A_ij = (x_i W^Q)(x_j W^K)^T / sqrt(2d) + (p_i U^Q)(p_j U^K)^T / sqrt(2d) + b_{j-i}

    Ke, He & Liu, "Rethinking Positional Encoding in Language Pre-training", ICLR 2021. No position
    is added to the input; the learned absolute table p (max_length x d_model) enters only through
    its own projections U^Q, U^K (d_model -> heads x head_dim). As in the paper, p, U^Q, U^K and b
    are shared by all layers (one instance, no `per_layer`). `logit_scale` = 1/sqrt(2) turns
    attention's q.k / sqrt(d) into q.k / sqrt(2d). b_{j-i} is T5's bucketed bias
    (`t5_relative_position_bucket`), per head. The [CLS] reset (theta) has no counterpart in a
    decoder LM and is left out. Positions beyond the table's last row cannot be encoded (LengthError).
    """
    family = "absolute+relative"
    citation = "Ke et al. 2021"
    extrapolates = "no"
    Options = TupeOptions
    traits = Traits(bias="tile", logit_scale="per_query")

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        self.rows = options.max_length or dims.train_length
        self.table = nnx.Param(nnx.initializers.normal(stddev=dims.d_model ** -0.5)(
            rngs.params(), (self.rows, dims.d_model), jnp.float32))
        w_init = nnx.initializers.normal(stddev=dims.d_model ** -0.5)
        shape = (dims.d_model, dims.num_heads, dims.head_dim)
        self.u_q = nnx.Param(w_init(rngs.params(), shape, jnp.float32))
        self.u_k = nnx.Param(w_init(rngs.params(), shape, jnp.float32))
        if options.relative:
            self.relative_table = nnx.Param(nnx.initializers.normal(stddev=0.02)(
                rngs.params(), (options.num_buckets, dims.num_heads), jnp.float32))

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        table = self.table[...]
        pq_BxTxHxK = jnp.einsum("btd,dhk->bthk", jnp.take(table, q_pos_BxT, axis=0), self.u_q[...])
        pk_BxSxHxK = jnp.einsum("bsd,dhk->bshk", jnp.take(table, k_pos_BxS, axis=0), self.u_k[...])
        bias_BxHxTxS = jnp.einsum("bthk,bshk->bhts", pq_BxTxHxK, pk_BxSxHxK) * (2 * self.dims.head_dim) ** -0.5
        if self.options.relative:
            buckets_BxTxS = t5_relative_position_bucket(
                k_pos_BxS[:, None, :] - q_pos_BxT[:, :, None], self.options.bidirectional,
                self.options.num_buckets, self.options.max_distance)
            bias_BxHxTxS = bias_BxHxTxS + jnp.moveaxis(
                jnp.take(self.relative_table[...], buckets_BxTxS, axis=0), -1, 1)
        return bias_BxHxTxS

    def logit_scale(self, q_pos_BxT, k_pos_BxS):
        return jnp.asarray(2.0 ** -0.5, jnp.float32)

    def check_length(self, length):
        check_table_length("tupe", self.rows, length)
