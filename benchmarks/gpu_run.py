"""The sections of benchmarks/gpu_first_run.sh that no other benchmark has: the machine as found,
what `model.attention=auto` picks for the paper model and why, and the paper model's training
tokens/s and MFU.

    python -m benchmarks.gpu_run env --out DIR
    python -m benchmarks.gpu_run auto --schemes alibi,rope,t5 --out DIR [--eval_lengths 4096] [--shrink]
    python -m benchmarks.gpu_run train --schemes alibi,rope,t5 --out DIR [--repeats 10] [--shrink]

The paper model: configs/wikitext103.py's 247M model (adaptive input and softmax, NAG, the paper's
dropout: attention dropout 0.1), bfloat16 compute, one micro-step of the paper's 9,216 tokens per
device (18 rows of 512), its training step built as `train()` builds it (a dropout key per row:
attention runs vmapped per row); `--shrink`: the tiny copy benchmarks.gpu_step --shrink uses (for a
dry run on a CPU; 4 rows of 128). `auto` traces the step (and an evaluation at --eval_lengths), which runs the
kernel's device check, launch search and race at that workload (models/attention/tuning.py), and
writes each pick with the verdicts, the search's timings and the race's times behind it (auto.json).
`train` compiles and times the step: median tokens/s of --repeats steps after 2 warm-ups, and MFU
over a bfloat16 8192^2 matmul peak measured in the same process (the model FLOPs of training's
own MFU, as benchmarks.gpu_step counts them, the adaptive bands by the batch's tokens); train.json. Each writes its
file after every scheme, so a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.metadata
import io
import json
import pathlib
import platform
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from benchmarks import common
from experiment.runtime.accelerator import enable_compilation_cache, peak_tflops, training_flops_per_token
from models.attention import choice, launches, tuning, verdicts, verify

PAPER_LENGTH, PAPER_ROWS = 512, 18  # the paper's 9,216 tokens per GPU
SHRUNK_LENGTH, SHRUNK_ROWS = 128, 4  # --shrink
PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint",
            "numpy", "ml-collections", "tensorboardX", "torch", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12")


def write_json(out: pathlib.Path, name: str, payload) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(payload, indent=1, default=str))


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def env(args) -> dict:
    """The machine as found: Python, jax and its plugins, the device, cuDNN, shared memory, nvidia-smi."""
    device = jax.devices()[0]
    info = {"python": sys.version, "platform": platform.platform(), "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()], "device_kind": device.device_kind,
            "compute_capability": getattr(device, "compute_capability", None),
            "shared_memory_kb": launches.shared_memory_limit() // 1024,
            "packages": {name: _version(name) for name in PACKAGES},
            "not_importable": [m for m in ("datasets", "gguf", "ml_collections", "tensorboardX") if not _imports(m)]}
    try:
        from jax._src.lib import cuda_versions
        info["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception as e:  # noqa: BLE001 - recorded
        info["cudnn"] = common.error_text(e)[:200]
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        info["nvidia_smi"] = common.error_text(e)[:200]
    write_json(args.out, "env.json", info)
    print(json.dumps({k: v for k, v in info.items() if k != "nvidia_smi"}, indent=1, default=str))
    print(info["nvidia_smi"])
    return info


@dataclasses.dataclass
class PaperStep:
    """One training step of the paper model on a fixed batch, as `train()` builds it."""
    step: object
    params: object
    opt_state: object
    tokens: jax.Array
    graphdef: object
    flops: float  # model FLOPs per step (benchmarks.gpu_step's formula)

    @property
    def tokens_per_step(self) -> int:
        return self.tokens.size


def paper_model(scheme: str, length: int, shrink: bool, dtype: str = "bfloat16", attention: str = "auto"):
    """(configs/wikitext103.py's 247M model for `scheme` trained at `length`, random weights, or its tiny
    copy with `shrink`; its model options; its config)."""
    from configs import wikitext103
    config = wikitext103.get_config(f"{scheme},{length},247m")
    if shrink:
        config.model.update(common.SHRINK_MODEL)
    vocab = common.SHRINK_VOCAB if shrink else common.WT103_VOCAB
    model = dict(config.model.to_dict(), vocab_size=vocab, dtype=dtype, attention=attention)
    return common.build(scheme, train_length=length, **model), model, config


def paper_step(scheme: str, shrink: bool, attention: str = "auto") -> PaperStep:
    from experiment.train.optimizer import make_optimizer
    from experiment.train.step import is_stochastic, make_train_step
    rows, length = (SHRUNK_ROWS, SHRUNK_LENGTH) if shrink else (PAPER_ROWS, PAPER_LENGTH)
    built, model, config = paper_model(scheme, length, shrink, attention=attention)
    vocab = model["vocab_size"]
    tokens = jnp.asarray(common.zipf_ids(vocab, (rows, length)))
    graphdef, params = nnx.split(built)
    tx = make_optimizer(config.train)
    step = make_train_step(graphdef, tx, dropout_seed=0,
                           per_example_keys=is_stochastic(built.cfg, posenc.get(scheme)))
    # the model FLOPs of training (experiment/runtime/accelerator.py, as benchmarks.gpu_step counts them):
    # the adaptive bands by the share of the batch's tokens in each
    bands = np.bincount(np.searchsorted(np.asarray(model["adaptive_cutoffs"]), np.asarray(tokens).ravel(),
                                        side="right"), minlength=len(model["adaptive_cutoffs"]) + 1) / tokens.size
    flops = training_flops_per_token(built.cfg, length, vocab, bands.tolist()) * tokens.size
    return PaperStep(step, params, tx.init(params), tokens, graphdef, flops)


def decisions() -> dict:
    """What the check, the search and the race decided in this process (their in-memory caches)."""
    said = {k: {"launch": t.launch.label if t.launch else None, "verdict": t.verdict.status, "why": t.verdict.reason,
                "timings_ms": t.timings, "rejected": t.rejected} for k, t in tuning._TUNED.items()}
    checks = {k: {"status": v.status, "reason": v.reason, "subject": v.subject,
                  "smallest_margin": min(verify.margins(v).values(), default=None),
                  "errors": v.errors, "tolerances": v.tolerances} for k, v in verdicts._VERDICTS.items()}
    return {"searches": said, "checks": checks, "races": dict(tuning._RACES)}


def forget_decisions() -> None:
    """Empty the in-memory caches of the check, the search, the race and auto's picks (a section per scheme)."""
    for cache in (tuning._TUNED, tuning._RACES, verdicts._VERDICTS, choice.PICKED):
        cache.clear()


def auto(args) -> list[dict]:
    """Each scheme's training step and evaluations traced: `auto`'s picks and what decided them."""
    results = []
    for scheme in args.schemes.split(","):
        forget_decisions()
        started = time.perf_counter()
        said = io.StringIO()
        record = {"scheme": scheme}
        try:
            run = paper_step(scheme, args.shrink)
            with contextlib.redirect_stdout(said):
                jax.jit(run.step).trace(run.params, run.opt_state, run.tokens, run.tokens, 0)
                record["train"] = choice.picked()
                for length in (int(x) for x in args.eval_lengths.split(",") if x):
                    choice.PICKED.clear()
                    tokens = jnp.zeros((max(1, run.tokens_per_step // length), length), jnp.int32)
                    common.scorer(run.graphdef).trace(run.params, tokens)
                    record[f"eval {length}"] = choice.picked()
        except Exception as e:  # noqa: BLE001 - recorded; the next scheme goes on
            record["error"] = common.error_text(e)
        record.update(said=said.getvalue().splitlines(), seconds=time.perf_counter() - started, **decisions())
        print(json.dumps({k: record.get(k) for k in ("scheme", "train", "said", "error", "seconds")}
                         | {k: v for k, v in record.items() if k.startswith("eval")}, indent=1, default=str),
              flush=True)
        for race in record["races"].values():
            print(f"  race: {race}", flush=True)
        results.append(record)
        write_json(args.out, "auto.json", {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                                       "launch_candidates": launches.width(), "schemes": results})
    return results


def matmul_peak() -> dict:
    """The matmul rate measured now, honestly: the best of 50 queued bfloat16 products of four shapes
    (on a CPU, a dry run: 8 float32 products of CPU-sized shapes; common.queued_matmul_peak), beside the detected card's
    data-sheet figure (experiment/runtime/accelerator.py; None where unknown). MFU is reported against
    both: against the measured rate (what this software stack reaches) and the data sheet's."""
    on_cpu = jax.default_backend() == "cpu"  # (a dry run: 8 products of each shape, not 50)
    measured = common.queued_matmul_peak("float32" if on_cpu else "bfloat16", queued=8 if on_cpu else 50)
    dtype = measured["dtype"]
    peak = measured["best"] / 1e12
    shapes = ", ".join(f"{s} {v / 1e12:.1f}" for s, v in measured["per_shape"].items())
    print(f"{jax.devices()[0].device_kind}: {dtype} matmul, best of {measured['queued']} queued products of each "
          f"shape: {peak:.1f} TFLOP/s ({shapes}); data sheet: {peak_tflops()}", flush=True)
    return {"dtype": dtype, "queued": measured["queued"], "per_shape_tflop_per_s":
            {s: v / 1e12 for s, v in measured["per_shape"].items()}, "tflop_per_s": peak,
            "datasheet_bf16_tflop_per_s": peak_tflops()}


def train(args) -> list[dict]:
    """Each scheme's training step compiled and timed: tokens/s and MFU."""
    peak = matmul_peak()
    results = []
    for scheme in args.schemes.split(","):
        forget_decisions()
        record = {"scheme": scheme}
        try:
            run = paper_step(scheme, args.shrink)
            record.update(rows=run.tokens.shape[0], length=run.tokens.shape[1])
            state = {"params": run.params, "opt": run.opt_state}
            runner = common.step_runner(run.step, state, run.tokens, run.tokens)
            started = time.perf_counter()
            jax.block_until_ready(runner())  # compiled here (auto's check, search and race from the disk cache)
            record.update(first_step_s=time.perf_counter() - started, attention_used=choice.picked())
            tokens_per_step = run.tokens_per_step
            tps = common.interleaved_tokens_per_s({scheme: runner}, tokens_per_step, args.repeats, warmup=2)[scheme]
            step_s = tokens_per_step / tps
            record.update(tokens_per_s=tps, step_ms=step_s * 1e3, model_tflop_per_step=run.flops / 1e12,
                          mfu=run.flops / step_s / (peak["tflop_per_s"] * 1e12),
                          mfu_datasheet=(run.flops / step_s / (peak["datasheet_bf16_tflop_per_s"] * 1e12)
                                         if peak["datasheet_bf16_tflop_per_s"] else None))
        except Exception as e:  # noqa: BLE001 - recorded; the next scheme goes on
            record["error"] = common.error_text(e)
        print(json.dumps(record, indent=1, default=str), flush=True)
        results.append(record)
        write_json(args.out, "train.json", {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                                        "matmul_peak": peak, "repeats": args.repeats, "rows": results})
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("section", choices=("env", "auto", "train"))
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--schemes", default="alibi,rope,t5")
    ap.add_argument("--eval_lengths", default="", help="evaluation lengths auto is also traced at (comma-separated)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--shrink", action="store_true", help="the tiny paper model (a dry run on a CPU)")
    args = ap.parse_args(argv)
    enable_compilation_cache()
    return {"env": env, "auto": auto, "train": train}[args.section](args)


if __name__ == "__main__":
    main()
