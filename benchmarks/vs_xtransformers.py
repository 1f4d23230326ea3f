"""Training throughput of our decoder against x-transformers (PyTorch, CPU) on the same model and
batch (d=256, 4 layers, 8 heads, FFN 1024, L=256, batch 8, byte vocabulary, tied embeddings, AdamW),
for the schemes both have. Both are built in one process and their steps alternate (ours, theirs,
ours, ...), so a busy machine slows both alike; the ratio is of median tokens/s, ours / theirs
(> 1: we are faster). Ours runs with `model.attention=auto` (triangular at this length) and, for
reference, with `dense`. The process keeps freed host memory mapped, as our entry points do
(experiment/host_memory.py), which applies to both frameworks in it.

    pip install -e '.[bench]'     # torch==2.13.0 (CPU) and x-transformers; not runtime dependencies
    python -m benchmarks.vs_xtransformers [--schemes alibi,rope] [--repeats 15]

Writes benchmarks/results/vs_xtransformers.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks import common
from benchmarks.throughput import train_runner
from experiment.host_memory import keep_freed_host_memory

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
    m = model or common.BENCH_MODEL
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


def interleaved_tokens_per_s(runners: dict, tokens_per_step: int, repeats: int, *, warmup: int = 2,
                             errors: dict | None = None) -> dict:
    """Median tokens/s of each zero-argument step function, timed in turns after `warmup` calls each.
    With `errors` (a dict) a runner that raises is dropped, its message stored there under its name."""
    import jax

    def ok(name, run) -> bool:
        try:
            jax.block_until_ready(run())
            return True
        except Exception as e:  # noqa: BLE001 - recorded: one failing runner must not end the benchmark
            if errors is None:
                raise
            errors[name] = f"{type(e).__name__}: {e}"[:2000]
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


def main():
    keep_freed_host_memory()  # before JAX (and torch) start their threads
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default=",".join(XT_SCHEMES))
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    for scheme in args.schemes.split(","):
        runners = {"ours": train_runner(scheme, args.seq_len, args.batch)[0],
                   "ours_dense": train_runner(scheme, args.seq_len, args.batch, attention="dense")[0],
                   "theirs": xtransformers_runner(scheme, args.seq_len, args.batch)}
        tps = interleaved_tokens_per_s(runners, args.batch * args.seq_len, args.repeats)
        row = {"scheme": scheme, "ours_tokens_per_s": tps["ours"], "xtransformers_tokens_per_s": tps["theirs"],
               "ours_over_theirs": tps["ours"] / tps["theirs"],
               "ours_dense_over_theirs": tps["ours_dense"] / tps["theirs"]}
        rows.append(row)
        common.print_table([row], list(row))
    print()
    common.print_table(rows, ["scheme", "ours_tokens_per_s", "xtransformers_tokens_per_s", "ours_over_theirs",
                              "ours_dense_over_theirs"])
    import importlib.metadata
    path = common.write("vs_xtransformers", {"model": common.BENCH_MODEL, "seq_len": args.seq_len,
                                             "batch": args.batch, "torch": torch.__version__,
                                             "torch_threads": torch.get_num_threads(),
                                             "x_transformers": importlib.metadata.version("x-transformers"),
                                             "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
