"""First contact with a GPU, in under three minutes: our Pallas kernel, jax's own Pallas flash
attention (`jax.experimental.pallas.ops.gpu.attention.mha`, rope and nope: it takes no bias) and cuDNN's
fused attention (`jax.nn.dot_product_attention(implementation="cudnn")`, with the bias materialised for
alibi and t5; no dropout) at the ALiBi paper's heads (8 of 128), bfloat16, L = 512 (8 rows) and at
4,096 and 16,384 (one row): each path's device-check verdict (ours and cuDNN's, models/attention/
verify.py), its forward error against a float32 reference, and its forward and backward TFLOP/s
(causal attention's products only: 2 x 2 x rows x heads x L^2 / 2 x head size forward, 2.5x that
backward; the backward's time is the forward and backward pass's less the forward's), one table.

    python -m benchmarks.first_contact          # a GPU; writes benchmarks/results/first_contact_<device>.json
    python -m benchmarks.first_contact --candidates 4 --schemes alibi,t5 --out FILE
    python -m benchmarks.first_contact --tiny   # any machine: small shapes, our kernel interpreted

Our kernel runs with the launch of a search of `--candidates` candidates of each kind (default 1:
this device's first, nothing timed; models/attention/launches.py), unchecked (its check's verdict is
a column); programs are kept in the persistent compilation cache (experiment/runtime/accelerator.py),
so a second run compiles nothing. A path that cannot run here (cuDNN off a GPU, jax's kernel on a CPU,
a shape a kernel refuses) is a row with its reason. Off a GPU (--tiny) the Pallas kernels run in their
interpreter: their errors count, their TFLOP/s do not.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from benchmarks import common
from experiment.runtime.accelerator import enable_compilation_cache
from experiment.selfcheck.table import slug
from models.attention import pallas, tuning, verdicts
from models.attention.pallas import Launch

SCHEMES = ("rope", "nope", "alibi", "t5")
SHAPES = ((8, 512), (1, 4096), (1, 16384))  # (rows, tokens)
TINY = dict(heads=2, head_dim=16, shapes=((2, 64), (1, 128)))


def positions(q) -> jax.Array:
    """0, 1, ... for every row of q (B x T x H x K): B x T."""
    return jnp.broadcast_to(jnp.arange(q.shape[1], dtype=jnp.int32), q.shape[:2])


_REFERENCES: dict = {}


def reference(q, k, v, scheme) -> np.ndarray:
    """Causal dense attention in float32 at the highest precision, in query chunks (experiment's
    self-check reference): the numbers every path is compared with; once per scheme and shape (every
    path of a row group gets the same inputs)."""
    from experiment.selfcheck.measure import reference_attention
    key = (scheme.name, q.shape)
    if key not in _REFERENCES:
        pos = positions(q)
        with jax.default_matmul_precision("highest"):
            out = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), pos, pos, scheme)
        _REFERENCES.clear()  # one at a time: at 16k tokens it is large
        _REFERENCES[key] = np.asarray(out, np.float64)
    return _REFERENCES[key]


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


def paths(scheme_name: str, gpu: bool, launch) -> dict:
    """{path: attention function (q, k, v, scheme) or the reason it does not run here}; off a GPU the
    Pallas kernels run in the interpreter (errors only: their speed there means nothing). `launch`:
    ours, for (rows, tokens)."""
    out = {"ours (pallas)": lambda q, k, v, s: ours(q, k, v, s, launch(q.shape[0], q.shape[1]))}
    if scheme_name in ("rope", "nope"):
        out["jax pallas mha"] = lambda q, k, v, s: jax_mha(q, k, v, s, not gpu)
    else:
        out["jax pallas mha"] = "takes no bias"
    out["cudnn"] = cudnn if gpu else "cuDNN is on NVIDIA GPUs only"
    return out


def causal_flops(rows: int, length: int, heads: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of causal attention's products (QK^T, PV forward; 2.5x that backward)."""
    forward = 2 * 2 * rows * heads * length * length * head_dim / 2
    return forward, 2.5 * forward


def verdict_of(path: str, scheme, dtype, launch: Launch | None, gpu: bool) -> str:
    """The device check's verdict on our kernel or cuDNN here ('' where there is none to run)."""
    if not gpu or path == "jax pallas mha":
        return ""
    verdict = verdicts.verified("pallas" if path.startswith("ours") else "fused", scheme, dtype, launch)
    return verdict.status if verdict.ok else f"{verdict.status}: {verdict.reason[:160]}"


def cached_verdict(path: str, scheme, dtype, launch: Launch | None, gpu: bool) -> str:
    """`verdict_of` where the machine's cache has it (an earlier check), else 'not checked here'."""
    if not gpu or path == "jax pallas mha":
        return ""
    key = verdicts.cache_key("check", scheme, dtype, launch, "pallas" if path.startswith("ours") else "fused")
    return verdict_of(path, scheme, dtype, launch, gpu) if verdicts.read_cached(key) else "not checked here"


def measure(name, attend, scheme, shape, dtype, check: str = "") -> dict:
    """One row: the forward error against the reference, forward and backward TFLOP/s."""
    (rows, length), heads, head_dim = shape, scheme.dims.num_heads, scheme.dims.head_dim
    row = {"scheme": scheme.name, "path": name, "rows": rows, "tokens": length, "check": check}
    if isinstance(attend, str):
        return {**row, "error": None, "forward_tflop_per_s": None, "backward_tflop_per_s": None, "note": attend}
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((rows, length, heads, head_dim)), dtype) for _ in range(3))
    started = time.perf_counter()
    try:
        want = reference(q, k, v, scheme)
        got = np.asarray(jax.jit(lambda q, k, v: attend(q, k, v, scheme))(q, k, v).astype(jnp.float32), np.float64)
        error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        graphdef, params, rest = nnx.split(scheme, nnx.Param, ...)

        def loss(params, q, k, v):
            return attend(q, k, v, nnx.merge(graphdef, params, rest)).astype(jnp.float32).sum()
        forward_s = tuning.loop_seconds(lambda params, q, k, v: attend(q, k, v, nnx.merge(graphdef, params, rest)),
                                        (params, q, k, v))
        both_s = tuning.loop_seconds(jax.grad(loss, argnums=(0, 1, 2, 3)), (params, q, k, v))
        forward, backward = causal_flops(rows, length, heads, head_dim)
        return {**row, "error": error, "forward_tflop_per_s": forward / forward_s / 1e12,
                "backward_tflop_per_s": backward / max(both_s - forward_s, 1e-9) / 1e12,
                "forward_ms": forward_s * 1e3, "forward_backward_ms": both_s * 1e3,
                "seconds": time.perf_counter() - started, "note": ""}
    except Exception as e:  # noqa: BLE001 - the row says why
        return {**row, "error": None, "forward_tflop_per_s": None, "backward_tflop_per_s": None,
                "note": common.error_text(e)[:160]}


COLUMNS = ["scheme", "path", "rows", "tokens", "check", "error", "forward_tflop_per_s", "backward_tflop_per_s",
           "note"]


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small shapes, any machine (our kernel interpreted off GPU)")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--candidates", type=int, default=1, help="launch candidates of each kind to time (0: all)")
    ap.add_argument("--pairs", default="", help="scheme:path,... to run, path one of ours, mha, cudnn (default: all)")
    ap.add_argument("--shapes", default="", help="rows x tokens,... (default 8x512,1x4096,1x16384)")
    ap.add_argument("--no_check", action="store_true", help="the verdict column from the machine's cache only")
    ap.add_argument("--out", default="", help="the JSON file (default: benchmarks/results/first_contact_<device>)")
    args = ap.parse_args(argv)
    earlier, os.environ["LX_LAUNCH_CANDIDATES"] = os.environ.get("LX_LAUNCH_CANDIDATES"), str(args.candidates)
    try:
        return _run(args)
    finally:  # the search's width is this command's only
        if earlier is None:
            os.environ.pop("LX_LAUNCH_CANDIDATES")
        else:
            os.environ["LX_LAUNCH_CANDIDATES"] = earlier


def _run(args) -> list[dict]:
    enable_compilation_cache()
    started = time.perf_counter()
    gpu = jax.default_backend() == "gpu"
    heads, head_dim, shapes = (TINY["heads"], TINY["head_dim"], TINY["shapes"]) if args.tiny else (8, 128, SHAPES)
    dtype = jnp.bfloat16
    device = jax.devices()[0].device_kind
    out = pathlib.Path(args.out) if args.out else common.RESULTS / f"first_contact_{slug(device)}.json"
    if args.shapes:
        shapes = tuple(tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(","))
    wanted = {tuple(p.split(":")) for p in args.pairs.split(",")} if args.pairs else None
    short = {"ours (pallas)": "ours", "jax pallas mha": "mha", "cudnn": "cudnn"}
    rows = []
    print(f"{device}, jax {jax.__version__}, {heads} heads of {head_dim}, bfloat16", flush=True)
    for name in args.schemes.split(","):
        dims = posenc.ModelDims(d_model=heads * head_dim, num_heads=heads, head_dim=head_dim, num_layers=1,
                                train_length=512)
        scheme = posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))
        tiny = Launch(block=16 if args.tiny else 64, interpret=True)
        launch = (lambda b, t: tuning.device_launch(scheme, dtype, tuning.Workload(b, t))) if gpu else (lambda b, t: tiny)
        for path, attend in paths(name, gpu, launch).items():
            if wanted is not None and (name, short[path]) not in wanted:
                continue
            for b, t in shapes:
                used = launch(b, t) if path.startswith("ours") else None
                check = ""
                if not isinstance(attend, str):
                    check = cached_verdict(path, scheme, dtype, used, gpu) if args.no_check else verdict_of(
                        path, scheme, dtype, used, gpu)
                row = measure(path, attend, scheme, (b, t), dtype, check)
                if used is not None:
                    row["launch"] = used.label
                rows.append(row)
                common.print_table([row], COLUMNS)
                if args.out or not args.tiny:  # as it goes: a run cut short keeps its rows
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps({"machine": common.machine(), "device": device, "rows": rows,
                                               "seconds": time.perf_counter() - started}, indent=1))
    if args.out or not args.tiny:
        print(f"wrote {out}")
    print(f"\n{time.perf_counter() - started:.0f} s")
    common.print_table(rows, COLUMNS)
    return rows


if __name__ == "__main__":
    main()
