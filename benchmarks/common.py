"""What the benchmarks share: the CPU-sized benchmark model, timing, XLA's cost and memory analysis,
and a results file. Benchmarks are run by hand (python -m benchmarks.<name>), never by CI."""
from __future__ import annotations

import json
import pathlib
import platform
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from models import DecoderLM, ModelConfig

RESULTS = pathlib.Path(__file__).parent / "results"
# the benchmark model of the issue: d=256, 4 layers, 8 heads, byte vocabulary
BENCH_MODEL = dict(vocab_size=256, num_layers=4, d_model=256, num_heads=8, mlp_dim=1024, activation="gelu")


def build(scheme: str, train_length: int, **overrides) -> DecoderLM:
    cfg = ModelConfig(**{**BENCH_MODEL, **overrides})
    return DecoderLM(cfg, posenc.default_config(scheme), train_length=train_length, rngs=nnx.Rngs(0))


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compiled_stats(jitted, *args) -> dict:
    """XLA's own accounting of one compiled program: flops, and the bytes of its arguments,
    outputs and temporaries (the peak of what the program holds at once, as buffer assignment
    plans it)."""
    compiled = jitted.lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    mem = compiled.memory_analysis()
    out = {"flops": float(cost.get("flops", 0.0)) if cost else 0.0}
    if mem is not None:
        out.update(argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
                   temp_bytes=int(mem.temp_size_in_bytes))
        out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"]
    return out


def matmul_peak_flops(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """FLOP/s of a large n x n matmul in `dtype` (float32, bfloat16) on this machine, measured now
    (the achievable peak)."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.dtype(dtype))
    f = jax.jit(lambda x: x @ x)
    return 2 * n ** 3 / median_seconds(lambda: f(a), repeats)


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor(), "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()]}


def write(name: str, payload: dict) -> pathlib.Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=1))
    return path


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(w) for c, w in zip(columns, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return "-" if v is None else str(v)
