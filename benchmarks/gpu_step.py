"""Training-step throughput and model-FLOPs utilisation on one accelerator, ours against
x-transformers (issue #15, item 4). Runs on any backend; the numbers mean something on a GPU.

Models, all with float32 parameters and optimizer state and bfloat16 compute:
  * standard: d = 1024, 16 layers, 8 heads, FFN 4096 (GELU), vocabulary 32,000, tied embeddings,
    AdamW with clipping, at L = 512 (batch 16) and L = 2048 (batch 4). Ours: `model.dtype=bfloat16`,
    one row per `--ours_attention` kind (unknown kinds are skipped with a note; `pallas` and `auto`
    run the kernel's device check first, models/attention/verify.py: a kernel that fails it is
    refused, its row recording why, and `auto` keeps XLA's paths). Theirs
    (x-transformers, the same sizes, XT_SCHEMES of benchmarks/common.py): forward and
    backward under torch.autocast(bfloat16), float32 parameters, torch's fused AdamW on CUDA, eager
    and torch.compile'd (the model; the optimizer step stays eager). Schemes sinusoidal, rope, alibi,
    t5 on both; kerple_log, fire, sandwich ours only.
  * paper: configs/wikitext103.py's 247M model (adaptive input and softmax over WikiText-103's
    267,735 words, ReLU, NAG), L = 512, 9,216 tokens per step, with the paper's dropout and without;
    ours only (x-transformers has no adaptive softmax); alibi and t5.

Every runner of one (model, scheme, L) is built in this one process, warmed up, then timed in turns
(one step of each, `--repeats` rounds); tokens/s is of the median step. Ratios: ours / theirs eager
and ours / theirs compiled, in the same rounds.

Model FLOPs per step (experiment/accelerator.training_flops_per_token, the MFU of training too):
    tokens x [ 6 x (layers x (4 d^2 + 2 d f) + output)  +  6 x layers x d x (L + 1) ]
i.e. 6 x (parameters in matrix products) x tokens plus attention's two products (QK^T, PV) over the
causal half of the window, (L + 1) / 2 keys per query on average; 3 x forward for training, no
rematerialisation; biases, norms, softmax and the optimizer not counted. output = d x V for a tied
embedding (the input side is a lookup, no FLOPs). Adaptive (paper model): the softmax head
d x (20,000 + 2 clusters) for every token; the adaptive input's projection dim_i x d of the token's
own band; tail cluster i's projection and scores d x dim_i + dim_i x (band size) only for tokens
whose target is in band i - the work needed, not what our static-shape implementation does (it
scores every band for every token). The band shares are those of the timed batch, whose words are
drawn by frequency rank from Zipf's law (p ~ 1 / rank; most in the head); the tails and input
projections add little to the 247M model's FLOPs per step (benchmarks/README.md, "Measured numbers
behind design choices"), so this assumption barely moves the MFU.
Theirs' MFU uses the same formula.
MFU = model FLOPs per step / median step time / a matmul peak measured in this run (bfloat16,
8192 x 8192 on accelerators; float32 1024 x 1024 on a CPU); `mfu_datasheet` is against the vendor's
dense bf16 peak (experiment/accelerator.PEAK_BF16_TFLOPS) where known.

    pip install -e '.[bench]'    # on a GPU machine: a CUDA build of torch instead of the pinned CPU one
    python -m benchmarks.gpu_step [--models standard,paper] [--schemes sinusoidal,rope,alibi,t5,...]
        [--lengths 512:16,2048:4] [--ours_attention auto,pallas] [--theirs eager,compiled]
        [--paper_schemes alibi,t5] [--paper_dropout on,off] [--repeats 10] [--shrink]

`--shrink`: tiny sizes (d = 64, 2 layers, vocabulary 512, L = 64 and 128; the paper model shrunk as
benchmarks/paper_experiment.py --shrink does, at L = 128) to check the script on a CPU. A runner that
fails (torch.compile without a compiler, out of memory, an attention kind a scheme lacks) gets its
error in its row; the others go on. Writes benchmarks/results/gpu_step_<device kind>.json (or in --out).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import os
import re

import numpy as np

from benchmarks import common

STANDARD = dict(vocab_size=32_000, num_layers=16, d_model=1024, num_heads=8, mlp_dim=4096, activation="gelu",
                tie_embeddings=True)
STANDARD_SHRUNK = dict(STANDARD, vocab_size=512, num_layers=2, d_model=64, num_heads=4, mlp_dim=256)
SCHEMES = "sinusoidal,rope,alibi,t5,kerple_log,fire,sandwich"
LENGTHS, LENGTHS_SHRUNK = "512:16,2048:4", "64:8,128:4"
PAPER_LENGTH, PAPER_TOKENS, PAPER_LENGTH_SHRUNK = 512, 9216, 128
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")
TARGET_RATIO, TARGET_T5_VS_ALIBI, TARGET_PAPER_MFU = 1.2, 0.85, 0.45


@dataclasses.dataclass
class Setting:
    """What every row group of one run shares."""
    args: argparse.Namespace
    peak: float  # FLOP/s of the matmul measured in this run
    datasheet: float | None  # TFLOP/s, the vendor's dense bf16 peak
    kinds: list[str]  # our attention kinds that ModelConfig accepts
    theirs_modes: list[str]  # x-transformers: eager, compiled (none without torch)
    torch_device: str | None  # cuda, cpu, or None without torch


def model_flops_per_step(model: dict, seq_len: int, batch: int, band_shares=None) -> float:
    """Model FLOPs of one training step of `model` (ModelConfig options, vocab_size included) on a
    batch x seq_len batch: the formula of the module docstring."""
    from experiment.runtime.accelerator import training_flops_per_token
    from models.config import ModelConfig
    cfg = ModelConfig.from_config({k: v for k, v in model.items() if k != "vocab_size"}, model["vocab_size"])
    return training_flops_per_token(cfg, seq_len, cfg.vocab_size, band_shares) * batch * seq_len


def band_shares(tokens: np.ndarray, cutoffs: tuple[int, ...]) -> list[float]:
    """The share of `tokens` in each adaptive band, head first."""
    bands = np.searchsorted(np.asarray(cutoffs), np.asarray(tokens).ravel(), side="right")
    return (np.bincount(bands, minlength=len(cutoffs) + 1) / bands.size).tolist()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


def usable_attention_kinds(kinds: list[str], model: dict) -> tuple[list[str], list[str]]:
    """(the kinds ModelConfig accepts, a note for each it does not)."""
    from models.config import ModelConfig
    good, notes = [], []
    for kind in kinds:
        try:
            ModelConfig.from_config({**{k: v for k, v in model.items() if k != "vocab_size"}, "attention": kind},
                                    model["vocab_size"])
            good.append(kind)
        except ValueError as e:
            notes.append(f"model.attention={kind} skipped: {e}")
            print(f"note: {notes[-1]}")
    return good, notes


def measure(setting: Setting, builders: dict, tokens_per_step: int, flops_per_step: float,
            base: dict) -> list[dict]:
    """Build every runner (name -> zero-argument builder), time them in turns, one row each."""
    from models.attention import choice
    runners, errors, used = {}, {}, {}
    for name, build in builders.items():
        try:
            choice.PICKED.clear()
            runners[name] = build()
            if name.startswith("ours"):
                runners[name]()  # compiled now: the attention path it runs is known (auto's pick)
                used[name] = choice.picked()
        except Exception as e:  # noqa: BLE001 - recorded in the row
            errors[name] = common.error_text(e)
    args = setting.args
    tps = common.interleaved_tokens_per_s(runners, tokens_per_step, args.repeats, warmup=args.warmup,
                                          errors=errors)
    del runners
    rows = []
    for name in builders:
        row = {**base, "runner": name, "tokens_per_s": tps.get(name), "step_ms": None, "mfu": None,
               "mfu_datasheet": None, "over_theirs_eager": None, "over_theirs_compiled": None,
               "attention_used": used.get(name), "error": errors.get(name)}
        if name in tps:
            step_s = tokens_per_step / tps[name]
            row.update(step_ms=1e3 * step_s, mfu=flops_per_step / step_s / setting.peak,
                       mfu_datasheet=flops_per_step / step_s / (setting.datasheet * 1e12) if setting.datasheet
                       else None)
            if name.startswith("ours"):
                for mode in ("eager", "compiled"):
                    if f"theirs {mode}" in tps:
                        row[f"over_theirs_{mode}"] = tps[name] / tps[f"theirs {mode}"]
        rows.append(row)
        print_rows([row], header=False)
    return rows


COLUMNS = ["model", "scheme", "seq_len", "batch", "dropout", "runner", "attention_used", "tokens_per_s", "step_ms",
           "mfu", "over_theirs_eager", "over_theirs_compiled", "error"]


def print_rows(rows: list[dict], header: bool = True) -> None:
    shown = [{**r, "error": (r["error"] or "")[:70] or None} for r in rows]
    if header:
        common.print_table(shown, COLUMNS)
    else:
        print("  ".join(f"{c}={common.fmt(shown[0].get(c))}" for c in COLUMNS if shown[0].get(c) is not None))


def targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, judged on these rows (value None: not measured)."""
    done = [r for r in rows if r["tokens_per_s"] is not None]
    std = [r for r in done if r["model"] == "standard"]
    out = []

    def add(text, value, threshold):
        out.append({"target": text, "value": value, "met": None if value is None else value >= threshold})
    lengths = sorted({r["seq_len"] for r in std})
    for scheme in ("sinusoidal", "rope", "alibi", "t5"):
        for length in lengths:
            best = max((r["over_theirs_compiled"] for r in std if r["scheme"] == scheme and r["seq_len"] == length
                        and r["over_theirs_compiled"] is not None), default=None)
            add(f"{scheme} L={length}: best ours / compiled x-transformers >= {TARGET_RATIO}", best, TARGET_RATIO)
    for length in lengths:
        for runner in sorted({r["runner"] for r in std if r["runner"].startswith("ours")}):
            tps = {r["scheme"]: r["tokens_per_s"] for r in std if r["seq_len"] == length and r["runner"] == runner}
            value = tps["t5"] / tps["alibi"] if {"t5", "alibi"} <= set(tps) else None
            add(f"L={length} {runner}: t5 / alibi tokens/s >= {TARGET_T5_VS_ALIBI}", value, TARGET_T5_VS_ALIBI)
    for scheme in sorted({r["scheme"] for r in done if r["model"] == "paper"}):
        best = max((r["mfu"] for r in done if r["model"] == "paper" and r["scheme"] == scheme and r["dropout"] == "on"),
                   default=None)
        add(f"paper {scheme} with dropout: best MFU >= {TARGET_PAPER_MFU}", best, TARGET_PAPER_MFU)
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="standard,paper")
    ap.add_argument("--schemes", default=SCHEMES, help="standard model's schemes")
    ap.add_argument("--lengths", default="", help=f"L:batch,... (default {LENGTHS}; --shrink {LENGTHS_SHRUNK})")
    ap.add_argument("--ours_attention", default="auto,pallas")
    ap.add_argument("--theirs", default="eager,compiled", help="x-transformers modes: eager,compiled (or none)")
    ap.add_argument("--paper_schemes", default="alibi,t5")
    ap.add_argument("--paper_dropout", default="on,off")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype, both frameworks (parameters: float32)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per runner (compilation, autotuning)")
    ap.add_argument("--peak_n", type=int, default=0, help="matmul size of the peak (default 8192; CPU 1024)")
    ap.add_argument("--shrink", action="store_true", help="tiny sizes (checks the script on a CPU)")
    ap.add_argument("--out", default="", help="the folder of the results file (default benchmarks/results)")
    return ap.parse_args()


def torch_device() -> str | None:
    """cuda or cpu for x-transformers, or None (with a note) where torch or x-transformers is missing."""
    try:
        import torch
        importlib.metadata.version("x-transformers")
    except (ImportError, importlib.metadata.PackageNotFoundError) as e:
        print(f"note: no x-transformers rows ({e}); pip install -e '.[bench]'")
        return None
    if torch.cuda.is_available():
        return "cuda"
    common.torch_on_all_cores()
    return "cpu"


def matmul_peak(args) -> dict:
    """The matmul peak measured now (bfloat16 8192^2 on accelerators, float32 1024^2 on a CPU) and the
    data sheet's bf16 peak where known."""
    import jax

    from experiment.runtime.accelerator import peak_tflops
    on_cpu = jax.default_backend() == "cpu"
    dtype, n = ("float32" if on_cpu else "bfloat16"), args.peak_n or (1024 if on_cpu else 8192)
    peak = common.matmul_peak_flops(n, repeats=10, dtype=dtype)
    datasheet = peak_tflops()
    print(f"{jax.devices()[0].device_kind}: {dtype} {n}^2 matmul peak measured now {peak / 1e12:.3f} TFLOP/s"
          + (f" (data sheet bf16: {datasheet} TFLOP/s)" if datasheet else ""))
    return {"dtype": dtype, "n": n, "tflop_per_s": peak / 1e12, "datasheet_bf16_tflop_per_s": datasheet}


def free_memory(setting: Setting) -> None:
    """Between row groups: drop the runners' buffers (and torch's cached CUDA blocks)."""
    gc.collect()
    if setting.torch_device == "cuda":
        import torch
        torch.cuda.empty_cache()


def standard_rows(setting: Setting, standard: dict) -> list[dict]:
    """The standard decoder at each length, every scheme: ours per attention kind, theirs per mode."""
    args, rows = setting.args, []
    for spec in (args.lengths or (LENGTHS_SHRUNK if args.shrink else LENGTHS)).split(","):
        length, batch = (int(x) for x in spec.split(":"))
        flops = model_flops_per_step(standard, length, batch)
        for scheme in args.schemes.split(","):
            builders = {f"ours {kind}": (lambda kind=kind: common.train_runner(
                scheme, length, batch, args.dtype, model=standard, attention=kind)[0]) for kind in setting.kinds}
            if scheme in common.XT_SCHEMES:
                if "compiled" in setting.theirs_modes:
                    import torch._dynamo
                    torch._dynamo.reset()  # a fresh compile cache each model: no recompile limit hit
                builders.update({f"theirs {mode}": (lambda mode=mode: common.xtransformers_runner(
                    scheme, length, batch, model=standard, dtype=args.dtype, compile=mode == "compiled",
                    device=setting.torch_device)) for mode in setting.theirs_modes})
            base = dict(model="standard", scheme=scheme, seq_len=length, batch=batch, dropout="off")
            rows += measure(setting, builders, batch * length, flops, base)
            free_memory(setting)
    return rows


def paper_rows(setting: Setting) -> list[dict]:
    """The paper model (--shrink: shrunk as paper_experiment's), ours only, with and without dropout."""
    import jax

    from configs import wikitext103
    args, rows = setting.args, []
    length = PAPER_LENGTH_SHRUNK if args.shrink else PAPER_LENGTH
    batch = PAPER_TOKENS // PAPER_LENGTH
    vocab = common.SHRINK_VOCAB if args.shrink else common.WT103_VOCAB
    tokens = common.zipf_ids(vocab, (batch, length))
    for scheme in args.paper_schemes.split(","):
        config = wikitext103.get_config(f"{scheme},{length},247m")
        if args.shrink:
            config.model.update(common.SHRINK_MODEL)
        for dropout in args.paper_dropout.split(","):
            model = dict(config.model.to_dict(), vocab_size=vocab, dtype=args.dtype)
            if dropout == "off":
                model.update({k: 0.0 for k in DROPOUTS})
            shares = band_shares(tokens, model["adaptive_cutoffs"])  # targets = inputs in common.train_runner
            flops = model_flops_per_step(model, length, batch, shares)
            builders = {f"ours {kind}": (lambda kind=kind, model=model, config=config: common.train_runner(
                scheme, length, batch, args.dtype, model=model, train=config.train,
                tokens=jax.numpy.asarray(tokens), attention=kind)[0]) for kind in setting.kinds}
            base = dict(model="paper", scheme=scheme, seq_len=length, batch=batch, dropout=dropout,
                        band_shares=shares)
            rows += measure(setting, builders, batch * length, flops, base)
            free_memory(setting)
    return rows


def print_targets(goals: list[dict]) -> None:
    print("\ntargets (issue #15):")
    for t in goals:
        value = "not measured" if t["value"] is None else f"{t['value']:.3f}"
        print(f"  {'-' if t['met'] is None else 'met' if t['met'] else 'NOT met'}: {t['target']} ({value})")


def torch_facts(device: str | None) -> dict:
    """For the results file: the device x-transformers ran on (the GPU's name) and the versions."""
    import jax
    facts = {"torch_device": device, "versions": {"jax": jax.__version__, "flax": importlib.metadata.version("flax"),
                                                  "torch": None, "x_transformers": None}}
    if device is not None:
        import torch
        facts["versions"].update(torch=torch.__version__, x_transformers=importlib.metadata.version("x-transformers"))
        if device == "cuda":
            facts["torch_device"] = torch.cuda.get_device_name(0)
    return facts


def main() -> None:
    # torch shares the accelerator with JAX in this process: JAX must not take 75% of it up front
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from experiment.runtime.host_memory import keep_freed_host_memory
    keep_freed_host_memory()  # CPU only: before JAX (and torch) start their threads
    args = parse_args()

    import jax
    device = torch_device()
    peak = matmul_peak(args)
    standard = STANDARD_SHRUNK if args.shrink else STANDARD
    kinds, notes = usable_attention_kinds(args.ours_attention.split(","), standard)
    setting = Setting(args, peak["tflop_per_s"] * 1e12, peak["datasheet_bf16_tflop_per_s"], kinds,
                      [] if device is None or args.theirs == "none" else args.theirs.split(","), device)
    rows = []
    if "standard" in args.models.split(","):
        rows += standard_rows(setting, standard)
    if "paper" in args.models.split(","):
        rows += paper_rows(setting)

    print()
    print_rows(rows)
    goals = targets(rows)
    print_targets(goals)
    device_kind = jax.devices()[0].device_kind
    payload = {"device_kind": device_kind, "devices": jax.device_count(), **torch_facts(device),
               "shrink": args.shrink, "dtype": args.dtype, "repeats": args.repeats, "warmup": args.warmup, "matmul_peak": peak, "standard_model": standard, "notes": notes,
               "rows": rows, "targets": goals}
    path = common.write(f"gpu_step_{slug(device_kind)}", payload, args.out or None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
