"""The device check's margins per scheme: for every scheme the Pallas kernel takes, the check
(models/attention/verify.py) run now on this machine, with and without attention dropout (and
`--paths fused`: cuDNN on a GPU), and each output's margin, tolerance / error (below 1: the check
rejects the kernel; the smaller, the nearer a correct kernel is to being rejected by rounding).

    python -m benchmarks.check_margins --dtype bfloat16 --heads 8 --head_dim 128 --block 64
    python -m benchmarks.check_margins --compiled --heads 8 --head_dim 128 --schemes alibi,t5,rope \\
        --paths pallas,pallas+dropout,fused --json margins.json      # on a GPU: the compiled kernels

Off a GPU the kernel runs in Pallas' interpreter with tiles of --block; `--compiled` (a GPU) runs it
compiled with the first launch candidates of this device (models/attention/launches.default: what a
search of one candidate takes), cuDNN for `fused`. Prints one markdown table (rows: scheme and check;
columns: the length checked, out, dq, dk, dv, their row-by-row errors where the check has them, the
smallest parameter-gradient margin), each row as it is done; writes it with --out, and every
verdict (errors, XLA's errors, tolerances, margins) with --json.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
from flax import nnx

import posenc
from experiment.runtime.accelerator import enable_compilation_cache
from models.attention import launches, pallas, verdicts, verify
from models.attention.pallas import Launch
from models.attention.paths import PATHS, CallSpec
from posenc import registry


def build(name: str, heads: int, head_dim: int) -> posenc.Scheme:
    dims = posenc.ModelDims(d_model=heads * head_dim, num_heads=heads, head_dim=head_dim, num_layers=1,
                            train_length=512)
    return posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))


def kernel_schemes(length: int) -> list[str]:
    """The registered schemes (with their defaults) whose row of PATHS the Pallas kernel accepts at `length`."""
    return [name for name in registry.names() if PATHS["pallas"].accepts(build(name, 2, 16).traits,
                                                                         CallSpec(name, length, 16, "float32")) is None]


def margins(verdict) -> dict[str, float]:
    # verify.margins, restated so that this script also runs against a check from before it (the
    # "before" table of benchmarks/README.md was taken on a worktree of cc15824)
    return {n: (verdict.tolerances[n] / e if e else math.inf)
            for n, e in verdict.errors.items() if n in verdict.tolerances}


def the_launch(compiled: bool, scheme: posenc.Scheme, dtype, block: int) -> Launch:
    """The interpreter's tiles of `block`, or (compiled, on a GPU) this device's first candidates."""
    if not compiled:
        return Launch(block=block, interpret=True)
    if pallas.interpreted():
        raise SystemExit("benchmarks.check_margins: --compiled runs the compiled kernel, on a GPU only; drop it here")
    limit = launches.shared_memory_limit()
    return launches.default(scheme.dims.head_dim, dtype, limit) or Launch(interpret=False)


COLUMNS = ["out", "dq", "dk", "dv", "out/row", "dq/row", "dk/row", "dv/row", "params"]  # dq/row: the earlier form


def row_of(name: str, path: str, verdict, length: int) -> tuple[str, dict]:
    """One markdown row and the JSON record of one verdict."""
    m = margins(verdict)
    params = [v for n, v in m.items() if n.startswith("d[")]
    cells = [m.get(c) for c in COLUMNS[:-1]] + [min(params) if params else None]
    fmt = lambda x: "–" if x is None else ("inf" if math.isinf(x) else f"{x:.1f}")
    smallest = min((x for x in cells if x is not None), default=None)
    line = f"| {name} | {path} ({verdict.status}) | {length} | {fmt(smallest)} | {' | '.join(map(fmt, cells))} |"
    record = {"scheme": name, "path": path, "status": verdict.status, "reason": verdict.reason, "length": length,
              "subject": verdict.subject, "smallest_margin": smallest, "margins": m, "errors": verdict.errors,
              "xla_errors": verdict.xla_errors, "tolerances": verdict.tolerances}
    return line, record


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head_dim", type=int, default=32)
    ap.add_argument("--block", type=int, default=16, help="the interpreter's tiles (not --compiled)")
    ap.add_argument("--schemes", default="", help="comma-separated (default: every scheme the kernel takes)")
    ap.add_argument("--paths", default="pallas,pallas+dropout", help="checks: pallas, pallas+dropout, fused")
    ap.add_argument("--pairs", default="", help="scheme:check,... in this order (instead of --schemes x --paths)")
    ap.add_argument("--compiled", action="store_true", help="the compiled kernels (a GPU)")
    ap.add_argument("--out", default="", help="the markdown table")
    ap.add_argument("--json", default="", help="every verdict")
    args = ap.parse_args(argv)
    enable_compilation_cache()
    dtype = jnp.dtype(args.dtype)
    names = args.schemes.split(",") if args.schemes else kernel_schemes(512)
    lines = [f"| scheme | check | length | smallest | {' | '.join(COLUMNS)} |", "|---|---|---:|" + "---:|" * (
        len(COLUMNS) + 1)]
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {dtype.name}, {args.heads} heads of "
          f"{args.head_dim}", flush=True)
    print("\n".join(lines), flush=True)
    records = []
    pairs = ([tuple(p.split(":")) for p in args.pairs.split(",")] if args.pairs else
             [(name, path) for name in names for path in args.paths.split(",")])
    schemes = {}
    for name, path in pairs:
        scheme = schemes.setdefault(name, build(name, args.heads, args.head_dim))
        launch = the_launch(args.compiled, scheme, dtype, args.block)
        checked = launch if PATHS[path.partition("+")[0]].tuned else None
        # compiled: through the machine's cache of verdicts, which the runs after this one read
        verdict = (verdicts.verified if args.compiled else verify.check)(path, scheme, dtype, checked)
        length = verify.check_length(path, scheme, dtype, max(checked.tiles) if checked else 64)
        line, record = row_of(name, path, verdict, length)
        record["launch"] = checked.label if checked else None
        lines.append(line)
        records.append(record)
        print(line + (f"  {verdict.reason}" if verdict.reason else ""), flush=True)
        if args.json:  # as it goes: a run cut short keeps what it checked
            pathlib.Path(args.json).write_text(json.dumps({"device": jax.devices()[0].device_kind,
                                                           "jax": jax.__version__, "dtype": dtype.name,
                                                           "heads": args.heads, "head_dim": args.head_dim,
                                                           "checks": records}, indent=1, default=str))
    if args.out:
        pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    return records


if __name__ == "__main__":
    sys.exit(0 if all(r["status"] in ("passed", "refused") for r in main()) else 1)
