"""FIRE: a learned function of the progressively normalised distance as the logits bias."""
from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from posenc import fast_form, pair_mlp
from posenc.base import ModelDims, Scheme
from posenc.kernel_bias import BiasFunction
from posenc.options.bias import FireOptions
from posenc.registry import register
from posenc.traits import Traits


def _torch_linear_init(key: jax.Array, fan_in: int, shape: tuple[int, ...]) -> jax.Array:
    """PyTorch's `nn.Linear` default: uniform in +-1/sqrt(fan_in), for weights and biases alike."""
    bound = fan_in ** -0.5
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


@register("fire")
class Fire(Scheme):
    """FIRE: logits[h, i, j] += f_theta(psi(i - j) / (psi(max(L, i)) + eps))_h, psi(x) = log(|c x| + 1).

    f_theta: R -> R^H is an MLP with one hidden ReLU layer (width `hidden`, 32 by default) and one
    output per head. Normalising by the query position makes every distance seen at any length
    fall in [0, 1] ("progressive interpolation"); the threshold L keeps short contexts from being
    stretched. max(L, i) depends on the query position only, so a tile's bias is its block of the
    full bias. Every layer has its own parameters (`per_layer`).

    Parameters and initialisation follow the authors' released FIRE module (Li et al., Appendix;
    the same module in McLeish et al.'s arithmetic code): c is learned from c_init = 0.1 and enters
    as |c|; L = |m * L_0| with L_0 = 512 fixed and the multiplier m learned from 1; eps = 1e-6;
    the MLP's weights and biases start as PyTorch's `nn.Linear` default (uniform in
    +-1/sqrt(fan_in)). `threshold_init=0` uses the training length as L_0 instead (an option of
    ours, not the reference's). For keys after the query (masked in a decoder) |i - j| is used.
    Li et al., "Functional Interpolation for Relative Positions Improves Long Context
    Transformers", ICLR 2024.
    """
    family = "relative"
    citation = "Li et al. 2024"
    extrapolates = "yes"
    Options = FireOptions
    traits = Traits(per_layer=True, bias="function")
    eps = 1e-6

    def __init__(self, options, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if options.hidden < 1 or options.c_init <= 0 or options.threshold_init < 0:
            raise ValueError("fire needs hidden >= 1, c_init > 0 and threshold_init >= 0")
        self.threshold_base = float(options.threshold_init or dims.train_length)
        self.c = nnx.Param(jnp.asarray(options.c_init, jnp.float32))
        self.threshold_multiplier = nnx.Param(jnp.asarray(1.0, jnp.float32))
        self.w1 = nnx.Param(_torch_linear_init(rngs.params(), 1, (options.hidden,)))
        self.b1 = nnx.Param(_torch_linear_init(rngs.params(), 1, (options.hidden,)))
        self.w2 = nnx.Param(_torch_linear_init(rngs.params(), options.hidden, (options.hidden, dims.num_heads)))
        self.b2 = nnx.Param(_torch_linear_init(rngs.params(), options.hidden, (dims.num_heads,)))

    def threshold(self) -> jax.Array:
        """L = |m L_0|."""
        return jnp.abs(self.threshold_multiplier[...] * self.threshold_base)

    def normalized_distance(self, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> jax.Array:
        """psi(i - j) / (psi(max(L, i)) + eps), B x T x S."""
        return normalized_distance(self.c[...], self.threshold(), q_pos_BxT[:, :, None], k_pos_BxS[:, None, :])

    def mlp(self, x: jax.Array) -> jax.Array:
        """f_theta on every element of x (B x T x S), B x H x T x S, as matrix products over chunks of
        query rows (posenc/pair_mlp.py)."""
        return pair_mlp.apply((x[:, None],), (self.w1[...][None],), self.b1[...], self.w2[...],
                              jax.nn.relu) + self.b2[...][:, None, None]

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        """B x H x T x S. The bias is a function of positions alone, so where every row has the same
        positions (training without position sampling, any evaluation) it is computed for one row and
        broadcast: a B-fold saving of the MLP's work, chosen at run time (posenc/fast_form.py)."""
        def of(q_pos, k_pos):
            return self.mlp(self.normalized_distance(q_pos, k_pos))

        b = max(q_pos_BxT.shape[0], k_pos_BxS.shape[0])
        if b == 1:
            return of(q_pos_BxT, k_pos_BxS)
        shape = (b, self.w2.shape[1], q_pos_BxT.shape[1], k_pos_BxS.shape[1])
        return fast_form.choose(fast_form.rows_alike(q_pos_BxT, k_pos_BxS),
                                lambda: jnp.broadcast_to(of(q_pos_BxT[:1], k_pos_BxS[:1]), shape),
                                lambda: jnp.broadcast_to(of(q_pos_BxT, k_pos_BxS), shape))

    def bias_fn(self):
        def tile(shared, head, q_pos_Qx1, k_pos_1xS):
            c, threshold, w1, b1 = shared
            w2, b2 = head
            x = normalized_distance(c, threshold, q_pos_Qx1, k_pos_1xS)
            out = jnp.broadcast_to(b2, x.shape)
            for w1_u, b1_u, w2_u in zip(w1, b1, w2):  # unrolled: the kernel gets scalars
                out = out + w2_u * jax.nn.relu(w1_u * x + b1_u)
            return out
        # one leaf per hidden unit: the kernel gets scalars, never slices a vector
        shared = (self.c[...], self.threshold(), tuple(self.w1[...]), tuple(self.b1[...]))
        return BiasFunction(tile, shared=shared, per_head=(tuple(self.w2[...]), self.b2[...]))


def normalized_distance(c: jax.Array, threshold: jax.Array, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """psi(i - j) / (psi(max(L, i)) + eps), psi(x) = log(|c x| + 1), for broadcasting position arrays."""
    distance = (q_pos - k_pos).astype(jnp.float32)
    query = jnp.maximum(q_pos.astype(jnp.float32), threshold)
    return jnp.log1p(jnp.abs(c * distance)) / (jnp.log1p(jnp.abs(c * query)) + Fire.eps)
