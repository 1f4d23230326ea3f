"""How far each reference default of issue #12 moves a scheme from its earlier behaviour, at
initialisation (no training): python -m benchmarks.reference_defaults. Prints one line per item."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import posenc
from models import DecoderLM, ModelConfig


def build(name, d=64, heads=4, train_length=512, **options):
    cfg = posenc.default_config(name)
    if options:
        cfg[name].update(options)
    dims = posenc.ModelDims(d_model=d, num_heads=heads, head_dim=d // heads, num_layers=1,
                            train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def fire() -> None:
    for length in (512, 64):  # normalised distance fed to the MLP, i <= 4L, keys j <= i
        i = jnp.arange(4 * length)
        new = build("fire", train_length=length).normalized_distance(i[None], i[None])[0]
        d = (i[:, None] - i[None, :]).astype(jnp.float32)
        old = jnp.log1p(jnp.maximum(d, 0)) / jnp.log1p(jnp.maximum(i.astype(jnp.float32), length))[:, None]
        print(f"fire, L={length}: max |x_reference - x_earlier| = {float(jnp.where(d >= 0, abs(new - old), 0).max()):.3f}")


def sinusoidal() -> None:
    pos = jnp.arange(2048)
    diff = posenc.fairseq_sinusoidal_table(pos + 2, 512) - posenc.sinusoidal_table(pos, 512)
    print(f"sinusoidal, d=512: max |PE_fairseq - PE_vaswani| = {float(jnp.abs(diff).max()):.3f}")


def deberta() -> None:
    q = jax.random.normal(jax.random.key(1), (1, 64, 4, 16))
    k = jax.random.normal(jax.random.key(2), (1, 64, 4, 16))
    p = jnp.arange(64)[None]
    code, paper = build("deberta", max_relative_positions=32), build("deberta", max_relative_positions=32,
                                                                     p2c_index="paper")
    print(f"deberta, default init: max |bias_code - bias_paper| = "
          f"{float(jnp.abs(code.bias(q, k, p, p) - paper.bias(q, k, p, p)).max()):.3f}")
    for i, param in enumerate((code.table, code.w_q, code.w_k)):
        param[...] = jax.random.normal(jax.random.key(3 + i), param.shape)
    paper.table[...], paper.w_q[...], paper.w_k[...] = code.table[...], code.w_q[...], code.w_k[...]
    print(f"deberta, unit-normal tables: max |bias_code - bias_paper| = "
          f"{float(jnp.abs(code.bias(q, k, p, p) - paper.bias(q, k, p, p)).max()):.1f}")


def sandwich() -> None:
    distance, zero = jnp.arange(2048)[None], jnp.zeros((1, 1), jnp.int32)
    a = build("sandwich", d=1024, heads=16).bias(None, None, distance, zero)
    b = build("sandwich", d=1024, heads=16, dim=0).bias(None, None, distance, zero)
    print(f"sandwich, paper model: max |bias(d'=128) - bias(d'=head dim 64)| = {float(jnp.abs(a - b).max()):.1f}")


def kerple() -> None:
    cfg = ModelConfig(vocab_size=11, num_layers=16, d_model=64, num_heads=8, mlp_dim=32)
    for per_layer in (True, False):
        block = posenc.default_config("kerple_log")
        block.kerple_log.per_layer = per_layer
        model = DecoderLM(cfg, block, train_length=512, rngs=nnx.Rngs(0))
        instances = {id(b.attn.scheme) for b in model.blocks}
        print(f"kerple_log, 16 layers x 8 heads, per_layer={per_layer}: {2 * 8 * len(instances)} parameters")


if __name__ == "__main__":
    for item in (sinusoidal, fire, kerple, deberta, sandwich):
        item()
