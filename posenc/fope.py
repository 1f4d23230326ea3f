"""FoPE: RoPE whose feature pairs each carry a Fourier series of frequencies, with the frequencies
that the training length cannot train clipped to zero."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.base import ModelDims, Scheme
from posenc.options.rotary import FopeOptions
from posenc.registry import register
from posenc.traits import Traits


def fope_frequencies(head_dim: int, train_length: int, base: float = 10000.0, floor_ratio: float = 1.0) -> np.ndarray:
    """RoPE's inverse frequencies base^(-2i/K), i < K/2, without those below floor_ratio * 2 pi /
    L_train (fewer than `floor_ratio` turns over the training length: undertrained, clipped to zero
    and so dropped from the series), as the reference computes them in float32."""
    inv_freq = (1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))).astype(np.float32)
    return inv_freq[inv_freq >= np.float32(2 * math.pi / train_length * floor_ratio)]


def step_eye(heads: int, rows: int, cols: int) -> np.ndarray:
    """H x M x C: a one at (m, c) for m = c * ceil(M / C) (where m < M), else zero; the identity
    when M = C. The reference's `get_step_eye`: pair c keeps every ceil(M/C)-th frequency as its
    dominant one."""
    out = np.zeros((heads, rows, cols), np.float32)
    step = math.ceil(rows / cols) if cols else 1
    for c in range(cols):
        if c * step < rows:
            out[:, c * step, c] = 1.0
    return out


@functools.lru_cache(maxsize=None)
def fourier_coefficients(heads: int, rows: int, cols: int, gain: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(sin, cos) coefficients, each H x M x C float32: the step identity plus a xavier-normal draw
    of gain `gain` (torch's fan rule for an H x M x C tensor: fan_in = M C, fan_out = H C, so
    std = gain sqrt(2 / ((M + H) C))), the sin draw first, from numpy's generator seeded `seed`."""
    rng = np.random.default_rng(seed)
    std = gain * math.sqrt(2.0 / ((rows + heads) * cols)) if cols else 0.0
    eye = step_eye(heads, rows, cols)
    sin = eye + (std * rng.standard_normal((heads, rows, cols))).astype(np.float32)
    cos = eye + (std * rng.standard_normal((heads, rows, cols))).astype(np.float32)
    return sin, cos


@register("fope")
class Fope(Scheme):
    """Fourier Position Embedding: RoPE in which feature pair j of head h is turned by a Fourier
    series rather than by one frequency:

        C_hj(m) = sum_i cos(m w_i) a_hij,  S_hj(m) = sum_i sin(m w_i) b_hij,
        (x1, x2)_j <- (x1 C - x2 S, x2 C + x1 S)_j  (q at its position m, k at n),

    over RoPE's frequencies w_i = base^(-2i/K) that make at least one turn within the training
    length (w_i >= 2 pi / L_train: the lower ones are undertrained and clipped to zero). The first
    C = min(M, K/4) pairs carry a series (M = frequencies kept); a and b are the identity spread
    over them (pair j's dominant frequency is w_(j ceil(M/C))) plus a xavier-normal draw of gain
    0.3, fixed. The remaining pairs get C = S = 1: no position, x1 - x2 and x1 + x2.

    Hua, Jiang, Lv, Sun, Hu, Li, Zhou, Zhang, Zhou & Qiu, "Fourier Position Embedding: Enhancing
    Attention's Periodic Extension for Length Generalization", arXiv 2412.17739, 2024. Ported from
    the authors' `FourierEmbedding` (TsinghuaC3I/Fourier-Position-Embedding, olmo/model.py, as
    mirrored in yiju-zhao/Fourier-Position-Embedding) in the configuration of their published runs
    (eye_xavier_norm, gain 0.3, separate sin / cos bases per head, zero frequencies ignored, floor
    clamped to zero, coefficients not learned). Their coefficients are drawn per layer by torch;
    here they come from numpy with `seed` and are the same in every layer, so that they are a
    constant of the options rather than state (no checkpoint entry, no optimizer update).
    """
    traits = Traits(rotates_per_head=True)  # its coefficients a_hij, b_hij are per head
    family = "relative"
    citation = "Hua et al. 2024"
    extrapolates = "partly"
    Options = FopeOptions

    def __init__(self, options: FopeOptions, dims: ModelDims, *, rngs: nnx.Rngs):
        super().__init__(options, dims, rngs=rngs)
        if dims.head_dim % 2:
            raise ValueError(f"fope rotates feature pairs; the head size must be even, got {dims.head_dim}")
        # Python numbers, not arrays: an array attribute would be state, and trained
        self.frequencies = tuple(float(w) for w in fope_frequencies(dims.head_dim, dims.train_length, options.base,
                                                                    options.floor_ratio))
        self.series = min(len(self.frequencies), dims.head_dim // 4)  # pairs with a Fourier series

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """(sin, cos) coefficients, H x M x C (M frequencies kept, C = min(M, K/4) pairs)."""
        return fourier_coefficients(self.dims.num_heads, len(self.frequencies), self.series,
                                    float(self.options.init_gain), int(self.options.seed))

    def turn(self, x_BxTxHxK: jax.Array, positions_BxT: jax.Array) -> jax.Array:
        """x with feature pair j (j, j + K/2) turned by (C_hj, S_hj) at its position."""
        sin_coef, cos_coef = self.coefficients()
        angles_BxTxM = positions_BxT.astype(jnp.float32)[..., None] * jnp.asarray(self.frequencies, jnp.float32)
        sin_BxTxHxC = jnp.einsum("btm,hmc->bthc", jnp.sin(angles_BxTxM), jnp.asarray(sin_coef))
        cos_BxTxHxC = jnp.einsum("btm,hmc->bthc", jnp.cos(angles_BxTxM), jnp.asarray(cos_coef))
        free = [(0, 0)] * 3 + [(0, x_BxTxHxK.shape[-1] // 2 - self.series)]  # position-free pairs: C = S = 1
        sin, cos = (jnp.pad(a, free, constant_values=1.0) for a in (sin_BxTxHxC, cos_BxTxHxC))
        x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
        turned = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return turned.astype(x_BxTxHxK.dtype)

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        return self.turn(q_BxTxHxK, q_pos_BxT), self.turn(k_BxSxHxK, k_pos_BxS)
