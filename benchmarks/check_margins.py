"""The device check's margins per scheme: for every scheme the Pallas kernel takes, the check
(models/attention/verify.py) run now on this machine (the kernel in Pallas' interpreter off a GPU),
with and without attention dropout, and each output's margin, tolerance / error (below 1: the check
rejects the kernel; the smaller, the nearer a correct kernel is to being rejected by rounding).

    python -m benchmarks.check_margins --dtype bfloat16 --heads 8 --head_dim 128 --block 64

prints one markdown table (rows: scheme and check; columns: out, dq, dk, dv, their row-by-row errors
where the check has them, the smallest parameter-gradient margin) and writes it with --out.
"""
from __future__ import annotations

import argparse
import math

import jax.numpy as jnp
from flax import nnx

import posenc
from posenc import registry
from models.attention import verify
from models.attention.pallas import Launch
from models.attention.paths import PATHS, Shape


def build(name: str, heads: int, head_dim: int) -> posenc.Scheme:
    dims = posenc.ModelDims(d_model=heads * head_dim, num_heads=heads, head_dim=head_dim, num_layers=1,
                            train_length=512)
    return posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))


def kernel_schemes(length: int) -> list[str]:
    """The registered schemes (with their defaults) whose row of PATHS the Pallas kernel accepts at `length`."""
    return [name for name in registry.names() if PATHS["pallas"].accepts(build(name, 2, 16).traits,
                                                                         Shape(name, length)) is None]


def margins(verdict) -> dict[str, float]:
    # verify.margins, restated so that this script also runs against a check from before it (the
    # "before" table of benchmarks/README.md was taken on a worktree of cc15824)
    return {n: (verdict.tolerances[n] / e if e else math.inf)
            for n, e in verdict.errors.items() if n in verdict.tolerances}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head_dim", type=int, default=32)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--schemes", default="", help="comma-separated (default: every scheme the kernel takes)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    launch = Launch(block=args.block, interpret=True)
    names = args.schemes.split(",") if args.schemes else kernel_schemes(512)
    columns = ["out", "dq", "dk", "dv", "out/row", "dq/row", "dk/row", "dv/row", "params"]  # dq/row: the earlier form
    lines = [f"| scheme | check | smallest | {' | '.join(columns)} |", "|---|---|" + "---:|" * (len(columns) + 1)]
    for name in names:
        scheme = build(name, args.heads, args.head_dim)
        for path in ("pallas", "pallas+dropout"):
            verdict = verify.check(path, scheme, jnp.dtype(args.dtype), launch)
            m = margins(verdict)
            params = [v for n, v in m.items() if n.startswith("d[")]
            cells = [m.get(c) for c in columns[:-1]] + [min(params) if params else None]
            fmt = lambda x: "–" if x is None else ("inf" if math.isinf(x) else f"{x:.1f}")
            smallest = min((x for x in cells if x is not None), default=None)
            lines.append(f"| {name} | {path} ({verdict.status}) | {fmt(smallest)} | {' | '.join(map(fmt, cells))} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
