"""First contact with a GPU, in about two minutes: our Pallas kernel, jax's own Pallas flash attention
(`jax.experimental.pallas.ops.gpu.attention.mha`, rope and nope: it takes no bias) and cuDNN's fused
attention (`jax.nn.dot_product_attention(implementation="cudnn")`, with the bias materialised for alibi
and t5; no dropout) at the ALiBi paper's heads (8 of 128), bfloat16, L = 512 (8 rows) and at
4,096 and 16,384 (one row): each path's forward error against a float32 reference and its forward +
backward TFLOP/s (causal attention's products only: 2 x 2 x rows x heads x L^2 / 2 x head size forward,
2.5x that backward), one table.

    python -m benchmarks.first_contact          # a GPU; writes benchmarks/results/first_contact_<device>.json
    python -m benchmarks.first_contact --tiny   # any machine: small shapes, our kernel interpreted

A path that cannot run here (cuDNN off a GPU, jax's kernel on a CPU, a shape a kernel refuses) is a
row with its reason. Our kernel runs unchecked here (this is the check's own comparison, not a run).
Off a GPU (--tiny) the Pallas kernels run in their interpreter: their errors count, their TFLOP/s do
not.
"""
from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from benchmarks import common
from experiment.selfcheck.table import slug
from models.attention import pallas, tuning
from models.attention.pallas import Launch

SCHEMES = ("rope", "nope", "alibi", "t5")
SHAPES = ((8, 512), (1, 4096), (1, 16384))  # (rows, tokens)
TINY = dict(heads=2, head_dim=16, shapes=((2, 64), (1, 128)))


def positions(q) -> jax.Array:
    """0, 1, ... for every row of q (B x T x H x K): B x T."""
    return jnp.broadcast_to(jnp.arange(q.shape[1], dtype=jnp.int32), q.shape[:2])


def reference(q, k, v, scheme):
    """Causal dense attention in float32 at the highest precision, in query chunks (experiment's
    self-check reference): the numbers every path is compared with."""
    from experiment.selfcheck.check import reference_attention
    pos = positions(q)
    with jax.default_matmul_precision("highest"):
        return reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), pos, pos, scheme)


def ours(q, k, v, scheme, launch):
    pos = positions(q)
    return pallas.pallas_attention(q, k, v, pos, pos, scheme, launch=launch)


def jax_mha(q, k, v, scheme, interpret):
    from jax.experimental.pallas.ops.gpu.attention import mha
    pos = positions(q)
    q, k = scheme.rotate(q, k, pos, pos)
    return mha(q, k, v, None, sm_scale=1 / math.sqrt(q.shape[-1]), causal=True, interpret=interpret)


def cudnn(q, k, v, scheme):
    pos = positions(q)
    q, k = scheme.rotate(q, k, pos, pos)
    bias = scheme.bias(q, k, pos, pos)
    if bias is not None:
        b, t, h, _ = q.shape
        bias = jnp.broadcast_to(bias, (b, h, t, t)).astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True, implementation="cudnn")


def paths(scheme_name: str, gpu: bool, launch: Launch) -> dict:
    """{path: attention function (q, k, v, scheme) or the reason it does not run here}; off a GPU the
    Pallas kernels run in the interpreter (errors only: their speed there means nothing)."""
    out = {"ours (pallas)": lambda q, k, v, s: ours(q, k, v, s, launch)}
    if scheme_name in ("rope", "nope"):
        out["jax pallas mha"] = lambda q, k, v, s: jax_mha(q, k, v, s, not gpu)
    else:
        out["jax pallas mha"] = "takes no bias"
    out["cudnn"] = cudnn if gpu else "cuDNN is on NVIDIA GPUs only"
    return out


def causal_flops(rows: int, length: int, heads: int, head_dim: int) -> float:
    """Forward + backward FLOPs of causal attention's products (QK^T, PV forward; 2.5x that backward)."""
    forward = 2 * 2 * rows * heads * length * length * head_dim / 2
    return 3.5 * forward


def measure(name, attend, scheme, rows, length, heads, head_dim, dtype) -> dict:
    row = {"scheme": scheme.name, "path": name, "rows": rows, "tokens": length}
    if isinstance(attend, str):
        return {**row, "error": None, "tflop_per_s": None, "note": attend}
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((rows, length, heads, head_dim)), dtype) for _ in range(3))
    try:
        want = np.asarray(reference(q, k, v, scheme), np.float64)
        got = np.asarray(jax.jit(lambda q, k, v: attend(q, k, v, scheme))(q, k, v).astype(jnp.float32), np.float64)
        error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        graphdef, params, rest = nnx.split(scheme, nnx.Param, ...)

        def loss(params, q, k, v):
            return attend(q, k, v, nnx.merge(graphdef, params, rest)).astype(jnp.float32).sum()
        seconds = tuning.loop_seconds(jax.grad(loss, argnums=(0, 1, 2, 3)), (params, q, k, v))
        return {**row, "error": error, "tflop_per_s": causal_flops(rows, length, heads, head_dim) / seconds / 1e12,
                "note": ""}
    except Exception as e:  # noqa: BLE001 - the row says why
        return {**row, "error": None, "tflop_per_s": None, "note": common.error_text(e)[:120]}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small shapes, any machine (our kernel interpreted off GPU)")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    args = ap.parse_args(argv)
    gpu = jax.default_backend() == "gpu"
    heads, head_dim, shapes = (TINY["heads"], TINY["head_dim"], TINY["shapes"]) if args.tiny else (8, 128, SHAPES)
    dtype = jnp.bfloat16
    rows = []
    for name in args.schemes.split(","):
        dims = posenc.ModelDims(d_model=heads * head_dim, num_heads=heads, head_dim=head_dim, num_layers=1,
                                train_length=512)
        scheme = posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))
        launch = tuning.device_launch(scheme, dtype) if gpu else Launch(block=16 if args.tiny else 64,
                                                                        interpret=True)
        for path, attend in paths(name, gpu, launch).items():
            for b, t in shapes:
                row = measure(path, attend, scheme, b, t, heads, head_dim, dtype)
                rows.append(row)
                common.print_table([row], list(row))
    device = jax.devices()[0].device_kind
    if not args.tiny:
        print(f"wrote {common.write(f'first_contact_{slug(device)}', {'device': device, 'rows': rows})}")
    print()
    common.print_table(rows, ["scheme", "path", "rows", "tokens", "error", "tflop_per_s", "note"])
    return rows


if __name__ == "__main__":
    main()
