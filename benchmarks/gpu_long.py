"""Long inputs on one accelerator, the sections of the second prepared GPU run (benchmarks/gpu_first_run.sh
--session b) that no other benchmark has: the paper model evaluated at growing lengths, and a long prefill
at SmolLM2-135M's shape with and without a fused attention kernel.

    python -m benchmarks.gpu_long evallen --out DIR [--schemes alibi,rope,sinusoidal] [--lengths 512,...,16384] [--shrink]
    python -m benchmarks.gpu_long prefill --out DIR [--lengths 8192,32768,65536] [--attention auto,blockwise] [--shrink]

evallen: configs/wikitext103.py's 247M model (trained length 512; random weights: only speed and memory
are measured), bfloat16, scored as the evaluation scores a batch (summed NLL, `common.scorer`) at each
length, about `--tokens` tokens a batch: per (scheme, length) the compile seconds, the median of 3
timed calls, tokens/s, the attention path `model.attention=auto` picked (and why, from its check and
race), and the device's peak memory in use so far (lengths run in increasing order, so each peak is its
own length's or an earlier one's). evallen.json, written after each length.

prefill: SmolLM2-135M's architecture (30 layers, d = 576, 9 query heads and 3 key-value heads of 64,
a gated MLP of 1,536, vocabulary 49,152, RoPE base 100,000, an 8,192 window) with random weights, one
prompt of each length through generation's prefill (models/generation/session.py) with each
`--attention` (auto: the fused kernel where one applies; blockwise: XLA's tiles), then 16 decoding steps:
compile and run seconds, prefill tokens/s and its fraction of the FLOP bound (the matmul rate measured
in the same process, benchmarks.gpu_run.matmul_peak; FLOPs: 2 x the matrix parameters a token, plus
causal attention's two products, 2 x layers x T^2 x d), decoding tokens/s, peak memory. prefill.json.

`--shrink` (a dry run on a CPU): the tiny paper model of benchmarks.gpu_step --shrink, and SmolLM2's
shape cut to 2 layers and a 1,024-word vocabulary, at the lengths given (CPU-sized). A length that fails
(out of memory, a refusal) records its error and the next goes on.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from benchmarks import common
from benchmarks.gpu_run import PAPER_LENGTH, decisions, forget_decisions, matmul_peak, paper_model, write_json
from experiment.runtime.accelerator import enable_compilation_cache
from models.attention import choice

SMOLLM2 = dict(vocab_size=49152, num_layers=30, d_model=576, num_heads=9, num_kv_heads=3, mlp_dim=1536, norm="rmsnorm",
               norm_eps=1e-5, mlp="gated", activation="silu", scale_embeddings=False, qkv_bias=False, out_bias=False,
               mlp_bias=False, tie_embeddings=True)
SMOLLM2_WINDOW, SMOLLM2_ROPE_BASE = 8192, 100000.0
SHRUNK_SMOLLM2 = dict(num_layers=2, vocab_size=1024)


def _peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def evallen(args) -> list[dict]:
    """Each scheme's evaluation at each length: compile, time, path, memory."""
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else (
        [128, 256, 512] if args.shrink else [512, 1024, 2048, 4096, 8192, 16384])
    rows = []
    for scheme in args.schemes.split(","):
        try:
            built, model, _ = paper_model(scheme, PAPER_LENGTH, args.shrink, dtype=args.dtype)
            graphdef, params = nnx.split(built)
            vocab = model["vocab_size"]
        except Exception as e:  # noqa: BLE001 - recorded; the next scheme goes on
            rows.append({"scheme": scheme, "error": common.error_text(e)})
            continue
        score = common.scorer(graphdef)
        for length in sorted(lengths):
            forget_decisions()
            row = {"scheme": scheme, "length": length}
            try:
                tokens = jnp.asarray(common.zipf_ids(vocab, (max(1, args.tokens // length), length)))
                started = time.perf_counter()
                compiled = score.lower(params, tokens).compile()  # auto's check, search and race run here
                row.update(rows=int(tokens.shape[0]), compile_s=time.perf_counter() - started,
                           attention=choice.picked())
                seconds = common.median_seconds(lambda: compiled(params, tokens), repeats=3, warmup=0)
                row.update(run_s=seconds, tokens_per_s=tokens.size / seconds, peak_bytes_so_far=_peak_bytes(),
                           decided={k: v for k, v in decisions().items() if v})
            except Exception as e:  # noqa: BLE001 - recorded; the next length goes on
                row["error"] = common.error_text(e)
            print(json.dumps({k: v for k, v in row.items() if k != "decided"}, default=str), flush=True)
            rows.append(row)
            write_json(args.out, "evallen.json", {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                                              "dtype": args.dtype, "tokens_per_batch": args.tokens, "rows": rows})
    return rows


def smollm2_shape(attention: str, dtype: str, shrink: bool):
    from models.config import ModelConfig
    from models.decoder import build_model
    cfg = posenc.default_config("rope")
    cfg.rope.base = SMOLLM2_ROPE_BASE
    sizes = dict(SMOLLM2, **(SHRUNK_SMOLLM2 if shrink else {}))
    return build_model(ModelConfig(**sizes, attention=attention, dtype=dtype), cfg, SMOLLM2_WINDOW, 0)


def prefill_flops(cfg, length: int) -> float:
    """2 x the parameters of the matrix products per token (the tied head once; not the embedding lookup),
    plus causal attention's two products: 2 x 2 x layers x (T^2 / 2) x (heads x head_dim)."""
    d, kv, head = cfg.d_model, cfg.num_kv_heads or cfg.num_heads, cfg.head_dim or cfg.d_model // cfg.num_heads
    per_layer = d * cfg.num_heads * head * 2 + d * kv * head * 2 + 3 * d * cfg.mlp_dim  # q, o; k, v; gate, up, down
    weights = 2 * (cfg.num_layers * per_layer + d * cfg.vocab_size) * length
    return weights + 2 * cfg.num_layers * length ** 2 * cfg.num_heads * head


def prefill(args) -> list[dict]:
    """SmolLM2's shape: a long prefill and a few decoding steps with each attention path."""
    from models.generation.session import Session
    peak = matmul_peak()
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else (
        [512, 1024] if args.shrink else [8192, 32768, 65536])
    rows = []
    for attention in args.attention.split(","):
        model = smollm2_shape(attention, args.dtype, args.shrink)
        for length in sorted(lengths):
            forget_decisions()
            row = {"attention": attention, "length": length}
            try:
                prompt = common.zipf_ids(model.cfg.vocab_size, (length,), seed=1).tolist()
                session = Session.start(model, 1, length + args.new)
                started = time.perf_counter()
                jax.block_until_ready(session.prefill([prompt]))  # compiled and run
                first = time.perf_counter() - started
                seconds = common.median_seconds(lambda: session.prefill([prompt]), repeats=2, warmup=0)
                row.update(first_s=first, prefill_s=seconds, prefill_tokens_per_s=length / seconds,
                           attention_used=choice.picked(),
                           fraction_of_bound=prefill_flops(model.cfg, length) / seconds / (peak["tflop_per_s"] * 1e12))
                token = np.zeros(1, np.int32)
                jax.block_until_ready(session.step(token))  # compiled
                started = time.perf_counter()
                for _ in range(args.new - 1):
                    logits = session.step(token)
                jax.block_until_ready(logits)
                row.update(decode_tokens_per_s=(args.new - 1) / (time.perf_counter() - started),
                           peak_bytes_so_far=_peak_bytes())
                del session
            except Exception as e:  # noqa: BLE001 - recorded; the next length goes on
                row["error"] = common.error_text(e)
            print(json.dumps(row, default=str), flush=True)
            rows.append(row)
            write_json(args.out, "prefill.json", {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                                              "dtype": args.dtype, "matmul_peak": peak, "rows": rows})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("section", choices=("evallen", "prefill"))
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--schemes", default="alibi,rope,sinusoidal", help="evallen: the paper model's schemes")
    ap.add_argument("--lengths", default="", help="comma-separated (default: evallen 512..16384, prefill 8k,32k,64k)")
    ap.add_argument("--tokens", type=int, default=16384, help="evallen: tokens a batch (rows = tokens // length)")
    ap.add_argument("--attention", default="auto,blockwise", help="prefill: the attention paths compared")
    ap.add_argument("--new", type=int, default=16, help="prefill: decoding steps after it")
    ap.add_argument("--dtype", default="", help="compute dtype (default bfloat16; float32 on a CPU)")
    ap.add_argument("--shrink", action="store_true", help="tiny shapes (a dry run on a CPU)")
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
    enable_compilation_cache()
    return {"evallen": evallen, "prefill": prefill}[args.section](args)


if __name__ == "__main__":
    main()
