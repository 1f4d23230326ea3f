"""Training throughput of our decoder against x-transformers (PyTorch, CPU) on the same model and
batch (d=256, 4 layers, 8 heads, FFN 1024, L=256, batch 8, byte vocabulary, tied embeddings, AdamW),
for the schemes both have. Both are built in one process and their steps alternate (ours, theirs,
ours, ...), so a busy machine slows both alike; the ratio is of median tokens/s, ours / theirs
(> 1: we are faster). Ours runs with `model.attention=auto` (triangular at this length) and, for
reference, with `dense`. The process keeps freed host memory mapped, as our entry points do
(experiment/runtime/host_memory.py), which applies to both frameworks in it.

    pip install -e '.[bench]'     # torch==2.13.0 (CPU) and x-transformers; not runtime dependencies
    python -m benchmarks.vs_xtransformers [--schemes alibi,rope] [--repeats 15]

Writes benchmarks/results/vs_xtransformers.json.
"""
from __future__ import annotations

import argparse
import importlib.metadata

from benchmarks import common
from experiment.runtime.host_memory import keep_freed_host_memory


def main():
    keep_freed_host_memory()  # before JAX (and torch) start their threads
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default=",".join(common.XT_SCHEMES))
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    import torch
    common.torch_on_all_cores()
    rows = []
    for scheme in args.schemes.split(","):
        runners = {"ours": common.train_runner(scheme, args.seq_len, args.batch)[0],
                   "ours_dense": common.train_runner(scheme, args.seq_len, args.batch, attention="dense")[0],
                   "theirs": common.xtransformers_runner(scheme, args.seq_len, args.batch)}
        tps = common.interleaved_tokens_per_s(runners, args.batch * args.seq_len, args.repeats)
        row = {"scheme": scheme, "ours_tokens_per_s": tps["ours"], "xtransformers_tokens_per_s": tps["theirs"],
               "ours_over_theirs": tps["ours"] / tps["theirs"],
               "ours_dense_over_theirs": tps["ours_dense"] / tps["theirs"]}
        rows.append(row)
        common.print_table([row], list(row))
    print()
    common.print_table(rows, ["scheme", "ours_tokens_per_s", "xtransformers_tokens_per_s", "ours_over_theirs",
                              "ours_dense_over_theirs"])
    path = common.write("vs_xtransformers", {"model": common.BENCH_MODEL, "seq_len": args.seq_len,
                                             "batch": args.batch, "torch": torch.__version__,
                                             "torch_threads": torch.get_num_threads(),
                                             "x_transformers": importlib.metadata.version("x-transformers"),
                                             "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
