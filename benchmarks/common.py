"""What more than one benchmark uses: the CPU-sized benchmark model, the paper's data sizes, timing,
training-step runners (ours and x-transformers') timed in turns, XLA's cost and memory analysis,
the categories of a compiled step's instructions and their profiled time, and a results file.
Benchmarks are run by hand (python -m benchmarks.<name>), never by CI; no benchmark imports another.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import multiprocessing
import os
import pathlib
import platform
import re
import statistics
import tempfile
import time
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import posenc
from experiment.config import TrainConfig
from experiment.train.optimizer import make_optimizer
from experiment.train.step import make_train_step
from models import DecoderLM
from models.config import ModelConfig

RESULTS = pathlib.Path(__file__).parent / "results"

# ---- models and data

# the benchmark model of the issue: d=256, 4 layers, 8 heads, byte vocabulary
BENCH_MODEL = dict(vocab_size=256, num_layers=4, d_model=256, num_heads=8, mlp_dim=1024, activation="gelu")
# the benchmark model's optimizer (AdamW with clipping)
TRAIN = TrainConfig(lr=1e-3, warmup_steps=10, steps=1000, min_lr_ratio=0.1, b1=0.9, b2=0.98,
                    weight_decay=0.1, grad_clip=1.0, optimizer="adamw")
# WikiText-103: word vocabulary, validation tokens; the paper's number of updates
WT103_VOCAB, WT103_VALID_TOKENS, PAPER_UPDATES = 267_735, 217_646, 286_000
# --shrink of paper_experiment and gpu_step: a tiny paper model over a 30,000-word vocabulary
SHRINK_VOCAB = 30_000
SHRINK_MODEL = dict(num_layers=2, d_model=64, num_heads=4, mlp_dim=128, adaptive_cutoffs=(2000, 10000))


# the training-free methods that move positions, at twice SmolLM2-135M's 8,192 window (as
# experiment/evals/methods.py sets them at 16k): benchmarks.moved_logits and moved_decode
MOVED_METHODS = {"rope": {}, "self_extend": dict(self_extend_window=2048, self_extend_group=4),
                 "dca": dict(dca_chunk_size=6144, dca_local_window=512), "rerope": dict(rerope_window=512)}


def smollm2_rope(options: dict, train_length: int = 8192):
    """RoPE with `options` at SmolLM2-135M's attention shape (9 heads of 64, d = 576), one layer."""
    cfg = posenc.default_config("rope")
    cfg.rope.update(options)
    dims = posenc.ModelDims(d_model=576, num_heads=9, head_dim=64, num_layers=1, train_length=train_length)
    return posenc.build(cfg, dims, rngs=nnx.Rngs(0))


def build(scheme: str, train_length: int, **overrides) -> DecoderLM:
    cfg = ModelConfig(**{**BENCH_MODEL, **overrides})
    return DecoderLM(cfg, posenc.default_config(scheme), train_length=train_length, rngs=nnx.Rngs(0))


def zipf_ids(vocab: int, shape: tuple[int, ...], exponent: float = 1.0, seed: int = 0) -> np.ndarray:
    """Word ids (frequency ranks) drawn from Zipf's law truncated to the vocabulary,
    p(rank r) ~ (r + 1) ** -exponent."""
    p = np.arange(1, vocab + 1, dtype=np.float64) ** -exponent
    return np.random.default_rng(seed).choice(vocab, size=shape, p=p / p.sum()).astype(np.int32)


def scorer(graphdef):
    """The jitted summed NLL of a batch, (params, tokens) -> scalar, of the model `graphdef` describes
    (the evaluation step)."""
    return jax.jit(lambda params, tokens: nnx.merge(graphdef, params).token_nll(tokens, tokens).sum())


# ---- training steps

def step_runner(step, state: dict, inputs, targets) -> Callable[[], jax.Array]:
    """A zero-argument function running the training `step` once on a fixed batch, updating
    `state` ({"params", "opt"}) in place; it returns the loss."""
    def run():
        state["params"], state["opt"], metrics = step(state["params"], state["opt"], inputs, targets, 0)
        return metrics["loss"]
    return run


def train_runner(scheme: str, seq_len: int, batch: int, dtype: str = "float32", *, model: dict | None = None,
                 train: TrainConfig | ml_collections.ConfigDict | None = None, tokens: jax.Array | None = None,
                 **model_overrides):
    """A zero-argument function running one training step (forward, backward, clipping, AdamW) of
    the benchmark model on a fixed batch, and what it needs: (run, step, state, tokens, graphdef).
    `model`: other model options (over the benchmark model's; `model_overrides` over both),
    `train`: other optimizer options (default TRAIN), `tokens`: the batch (default uniform ids)."""
    built = build(scheme, train_length=seq_len, **{**(model or {}), "dtype": dtype, **model_overrides})
    graphdef, params = nnx.split(built)
    tx = make_optimizer(train or TRAIN)
    step = make_train_step(graphdef, tx, dropout_seed=0)
    if tokens is None:
        tokens = jax.random.randint(jax.random.key(0), (batch, seq_len), 0, built.cfg.vocab_size)
    state = {"params": params, "opt": tx.init(params)}
    return step_runner(step, state, tokens, tokens), step, state, tokens, graphdef


# our registry name -> x-transformers options (TransformerWrapper kwargs, Decoder kwargs)
XT_SCHEMES = {
    "sinusoidal": ({"use_abs_pos_emb": True, "scaled_sinu_pos_emb": True}, {}),
    "rope": ({"use_abs_pos_emb": False}, {"rotary_pos_emb": True}),
    "alibi": ({"use_abs_pos_emb": False}, {"alibi_pos_bias": True}),
    "t5": ({"use_abs_pos_emb": False}, {"rel_pos_bias": True}),
    "nope": ({"use_abs_pos_emb": False}, {}),
}


def xtransformers_runner(scheme: str, seq_len: int, batch: int, *, model: dict | None = None,
                         dtype: str = "float32", compile: bool = False, device: str = "cpu"):
    """A zero-argument function running one x-transformers training step on a fixed batch.
    `model`: the sizes (default the benchmark model); `dtype` bfloat16: float32 parameters and
    optimizer, the forward and backward under torch.autocast(bfloat16) (our model.dtype policy);
    `compile`: the model torch.compile'd (the optimizer step stays eager); `device`: cpu or cuda
    (there AdamW is torch's fused kernel and the step waits for the GPU before returning)."""
    import torch
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    wrapper_kw, decoder_kw = XT_SCHEMES[scheme]
    m = model or BENCH_MODEL
    net = TransformerWrapper(
        num_tokens=m["vocab_size"], max_seq_len=seq_len, tie_embedding=True, **wrapper_kw,
        attn_layers=Decoder(dim=m["d_model"], depth=m["num_layers"], heads=m["num_heads"],
                            attn_dim_head=m["d_model"] // m["num_heads"],
                            ff_mult=m["mlp_dim"] // m["d_model"], **decoder_kw)).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.1, fused=device.startswith("cuda"))
    forward = torch.compile(net) if compile else net
    tokens = torch.randint(0, m["vocab_size"], (batch, seq_len + 1), device=device)
    autocast = torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step():
        with autocast:
            logits = forward(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                     tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    return step


def torch_on_all_cores() -> None:
    """torch's CPU ops: one thread per core, as XLA's CPU runtime has."""
    import torch
    torch.set_num_threads(os.cpu_count() or 1)


# ---- timing

def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_tokens_per_s(runners: dict, tokens_per_step: int, repeats: int, *, warmup: int = 2,
                             errors: dict | None = None) -> dict:
    """Median tokens/s of each zero-argument step function, timed in turns after `warmup` calls each.
    With `errors` (a dict) a runner that raises is dropped, its message stored there under its name."""
    def ok(name, run) -> bool:
        try:
            jax.block_until_ready(run())
            return True
        except Exception as e:  # noqa: BLE001 - recorded: one failing runner must not end the benchmark
            if errors is None:
                raise
            errors[name] = error_text(e)
            return False

    live = {name: run for name, run in runners.items() if all(ok(name, run) for _ in range(warmup))}
    times = {name: [] for name in live}
    for _ in range(repeats):
        for name, run in list(live.items()):
            t0 = time.perf_counter()
            if ok(name, run):
                times[name].append(time.perf_counter() - t0)
            else:
                del live[name], times[name]
    return {name: tokens_per_step / statistics.median(t) for name, t in times.items()}


def error_text(e: BaseException) -> str:
    """An exception as a row records it."""
    return f"{type(e).__name__}: {e}"[:2000]


def matmul_peak_flops(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """FLOP/s of a large n x n matmul in `dtype` (float32, bfloat16) on this machine, measured now
    (the achievable peak)."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.dtype(dtype))
    f = jax.jit(lambda x: x @ x)
    return 2 * n ** 3 / median_seconds(lambda: f(a), repeats)


# The products the queued peak is the best of: square, and the tall and wide shapes of a model's layers
PEAK_SHAPES = {"accelerator": ((8192, 8192, 8192), (16384, 4096, 4096), (4096, 4096, 16384), (4096, 16384, 4096)),
               "cpu": ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 576, 1536), (4096, 1536, 576))}


def queued_matmul_peak(dtype: str = "bfloat16", shapes=None, queued: int = 50, rounds: int = 3) -> dict:
    """The best FLOP/s of `queued` products of each (m, k, n) shape in `shapes` dispatched without waiting
    (the device never idles between two, as in a training step), best of `rounds` rounds; per shape and
    the best over them. One awaited product undercounts a GPU's rate (launch and sync around each)."""
    shapes = shapes or PEAK_SHAPES["cpu" if jax.default_backend() == "cpu" else "accelerator"]
    rng, per_shape = np.random.default_rng(0), {}
    f = jax.jit(lambda a, b: a @ b)
    for m, k, n in shapes:
        a = jnp.asarray(rng.standard_normal((m, k)), jnp.dtype(dtype))
        b = jnp.asarray(rng.standard_normal((k, n)), jnp.dtype(dtype))
        jax.block_until_ready(f(a, b))  # compiled
        best = 0.0
        for _ in range(rounds):
            start = time.perf_counter()
            outs = [f(a, b) for _ in range(queued)]
            jax.block_until_ready(outs)
            best = max(best, 2 * m * k * n * queued / (time.perf_counter() - start))
            del outs
        per_shape[f"{m}x{k}x{n}"] = best
    return {"dtype": dtype, "queued": queued, "per_shape": per_shape, "best": max(per_shape.values())}


def in_fresh_process(target: Callable, *args):
    """What target(*args, queue) puts on its queue, run in a fresh (spawned) process: for settings that
    are process-wide (malloc options) or for the peak resident memory of one measurement alone."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"measurement process failed (exit code {proc.exitcode})")
    return queue.get()


# ---- XLA's view of a compiled step

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


# the JAX operations (last part of an instruction's op_name) that only move data
LAYOUT_OPS = {"transpose", "reshape", "pad", "slice", "split", "concatenate", "copy"}
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+)")
_OP_NAME = re.compile(r'op_name="([^"]+)"')


def step_category(name: str, op_name: str, attention: bool) -> str:
    """The category of an instruction `name` (from JAX operation `op_name`) of a compiled training step:
    optimizer (outside the differentiated function), attention (`attention`: the caller's test of its
    shape), dense products, layout copies (its operation only moves data, or a fusion is named after
    transposing copies: copy_bitcast), or other."""
    if "jvp(" not in op_name:
        return "optimizer"
    if attention:
        return "attention"
    if op_name.endswith("dot_general") or name.startswith("dot"):
        return "dense products"
    if op_name.rsplit("/", 1)[-1] in LAYOUT_OPS or name.startswith(("copy_bitcast", "bitcast_copy", "transpose")):
        return "layout copies"
    return "other"


def instruction_categories(hlo: str, categorize) -> dict[str, str]:
    """Every instruction of a compiled program's HLO text -> categorize(name, shape, op_name)."""
    categories = {}
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            op = _OP_NAME.search(line)
            categories.setdefault(m.group(1), categorize(m.group(1), m.group(2), op.group(1) if op else ""))
    return categories


def traced_ms(run, steps: int, categories: dict[str, str], skip=lambda name: False) -> collections.Counter:
    """Milliseconds per step by category, from a `jax.profiler` trace of `steps` calls of `run`:
    complete events named after an instruction of the step (not runtime spans), except `skip`ped ones."""
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for _ in range(steps):
            jax.block_until_ready(run())
        jax.profiler.stop_trace()
        (path,) = glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz"))
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    ms = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e["name"] in categories and not skip(e["name"]):
            ms[categories[e["name"]]] += e["dur"] / 1e3 / steps
    return ms


# ---- results

def cpu_model() -> dict:
    """The CPU's model name, core count and widest vector extension (/proc/cpuinfo; {} elsewhere):
    ratios against a PyTorch peer depend on the CPU (benchmarks/README.md, the fair table)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    vector = next((f for f in ("avx512f", "avx2", "avx") if f in flags), "")
    numbers = {key: next((line.split(":", 1)[1].strip() for line in text.splitlines()
                          if line.split(":", 1)[0].strip() == key), "") for key in ("cpu family", "model")}
    return {"cpu": name, "cpu_family": numbers["cpu family"], "cpu_model": numbers["model"], "cores": os.cpu_count(),
            "vector": vector}


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor(), **cpu_model(), "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()]}


def write(name: str, payload: dict, folder: pathlib.Path | None = None) -> pathlib.Path:
    """benchmarks/results/<name>.json (or in `folder`), with the machine it ran on."""
    folder = pathlib.Path(folder) if folder else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=1))
    return path


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(fmt(r.get(c)).rjust(w) for c, w in zip(columns, widths)))


def fmt(v) -> str:
    """A table cell: floats to 3 significant digits (thousands separated), None as '-'."""
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return "-" if v is None else str(v)
