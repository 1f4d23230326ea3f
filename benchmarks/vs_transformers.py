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
"""
from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("--out", required=True, type=pathlib.Path)
    ex.add_argument("--run", default=None, help="a run trained here with a Llama block and plain RoPE")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("out", type=pathlib.Path)
    args = ap.parse_args()
    if args.command == "export":
        sys.path.insert(0, str(REPO))
        export_cases(args.out, args.run)
    else:
        compare(args.out)


if __name__ == "__main__":
    main()
