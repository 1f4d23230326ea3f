"""Where the paper model's training step goes, by category, on a CPU-sized copy of it that keeps
what drives its costs: the WikiText-103 word vocabulary (267,735), tied adaptive input + adaptive
softmax with cutoffs (20000, 60000) and factor 4, ReLU, dropout 0.3 / attention 0.1 / activation
0.1, the paper's optimizer (NAG, clipping) and its training step (one dropout key per row, as
`train()` builds it), at L=512 -- but d_model 256, 4 layers, 4 heads, FFN 1024 and 2 sequences.

    python -m benchmarks.paper_step [--layers 4] [--d_model 256] [--batch 2] [--steps 3]
        [--tail_capacity 0.25] [--no-compare]

Targets are Zipf-distributed word ranks, exponent 1.1: about the tail share issue #15 estimates for
WikiText-103 (~10% of tokens beyond the head), and few enough tail tokens per row for the default
tail capacity's slots (the shares: benchmarks/README.md, "Measured numbers behind design choices").
Categories (instructions of the compiled step, see benchmarks/step_profile.py for the method; the
softmax and input are recognised by their named scopes in models/adaptive.py and by their band-sized
shapes, which also catches the converts and transposing copies XLA adds to them):
  adaptive softmax head   head logits (c0 words + clusters), log-softmax, forward and backward
  adaptive softmax tails  tail cluster projections, logits, logsumexp, their gradients
  adaptive input          band lookups and projections of the adaptive input
  dropout RNG             key splitting / folding and the random bits of the dropout masks
  attention               everything on B x H x ... tensors
  dense products          the layers' q/k/v, output and MLP products
  layout copies           transposes, slices, pads, concatenations outside the above
  optimizer               clipping and NAG (ops outside the differentiated function)
  other                   LayerNorm, ReLU, residual adds, applying dropout masks, ...
The comparison (default on) times pairs of steps alternately in this process: every tail cluster
computed for every token (`tail_capacity=0`, the old `nll`) against the default; the dropout keys'
PRNG, threefry against rbg (`train.dropout_rng`); dropout against none (same per-row keys).
Writes benchmarks/results/paper_step.json.
"""
from __future__ import annotations

import argparse
import re

import jax
from flax import nnx

from benchmarks import common
from benchmarks.common import WT103_VOCAB
from configs import wikitext103
from experiment.model import build_model
from experiment.train.optimizer import make_optimizer
from experiment.train.step import make_train_step
from experiment.runtime.host_memory import keep_freed_host_memory

CATEGORIES = ("adaptive softmax head", "adaptive softmax tails", "adaptive input", "dropout RNG", "attention",
              "dense products", "layout copies", "optimizer", "other")
_RNG = re.compile(r"threefry|_bernoulli|_uniform|random_bits|_split|fold_in|rng_bit_generator|random_wrap|"
                  r"random_unwrap|random_seed")
_CONTROL = re.compile(r"(cond|conditional|while|call)(\.\d+)?$")
_SHAPE = re.compile(r"\w+\[([\d,]*)\]")


def paper_config(layers: int, d_model: int, heads: int, mlp_dim: int):
    config = wikitext103.get_config("alibi,512")
    config.model.update(dict(num_layers=layers, d_model=d_model, num_heads=heads, mlp_dim=mlp_dim))
    return config


def paper_runner(config, batch: int, *, tail_capacity: float | None = None, rng_impl: str | None = None):
    """(run, step, state, args): one training step of the paper model as `train()` builds it
    (per-row dropout keys, NAG, clipping) on a fixed Zipf batch. `tail_capacity` overrides the
    adaptive softmax's (0: every tail for every token); `rng_impl` the dropout keys' PRNG."""
    seq_len = config.train.seq_len
    if tail_capacity is not None:
        config = config.copy_and_resolve_references()
        config.model.adaptive_tail_capacity = tail_capacity
    model = build_model(config, WT103_VOCAB)
    graphdef, params = nnx.split(model)
    tx = make_optimizer(config.train)
    step = make_train_step(graphdef, tx, 2, per_example_keys=True, rng_impl=rng_impl or "threefry")
    ids = common.zipf_ids(WT103_VOCAB, (batch, seq_len + 1), exponent=1.1)
    inputs, targets = jax.numpy.asarray(ids[:, :-1]), jax.numpy.asarray(ids[:, 1:])
    state = {"params": params, "opt": tx.init(params)}
    return common.step_runner(step, state, inputs, targets), step, state, (inputs, targets)


def category(name: str, shape: str, op_name: str, batch: int, heads: int, bands: tuple[int, ...]) -> str:
    """The category of one instruction of the compiled paper step (see the module docstring)."""
    if _RNG.search(op_name):
        return "dropout RNG"
    if "adaptive_softmax_tail" in op_name:
        return "adaptive softmax tails"
    if "adaptive_softmax_head" in op_name:
        return "adaptive softmax head"
    if "adaptive_input" in op_name:
        return "adaptive input"
    dims = _SHAPE.match(shape)
    dims = tuple(int(d) for d in dims.group(1).split(",") if d) if dims else ()
    if any(d in bands[1:] for d in dims):  # (also XLA's own converts and copies, which have no op_name)
        return "adaptive softmax tails"
    if any(d in (bands[0], bands[0] + len(bands) - 1) for d in dims):
        return "adaptive softmax head"
    if not op_name:  # made by XLA (layout assignment, dtype converts)
        return "layout copies" if name.startswith(("copy", "bitcast", "transpose")) else "other"
    attention = len(dims) >= 3 and (dims[1] == heads or dims[1:3] == (1, heads)) and dims[0] == batch
    return common.step_category(name, op_name, attention)


def profile(run, step, state, args, config, batch: int, steps: int) -> dict:
    cutoffs = tuple(config.model.adaptive_cutoffs)
    edges = (0, *cutoffs, WT103_VOCAB)
    bands = tuple(b - a for a, b in zip(edges, edges[1:]))
    compiled = step.lower(state["params"], state["opt"], *args, 0).compile()
    hlo = compiled.as_text()
    temp_mb = compiled.memory_analysis().temp_size_in_bytes / 2**20  # XLA's plan: either branch of a cond
    categories = common.instruction_categories(
        hlo, lambda name, shape, op: category(name, shape, op, batch, config.model.num_heads, bands))
    step_ms = common.median_seconds(run, max(steps, 3), warmup=1) * 1e3
    # leaf ops only: a cond's or while's own event spans the ops of its body
    ms = common.traced_ms(run, steps, categories, skip=lambda name: bool(_CONTROL.match(name)))
    return {"step_ms": step_ms, "temp_mb": temp_mb, "ms": {c: ms[c] for c in CATEGORIES}}


def profiled_rows(config, args) -> list[dict]:
    """ms per category of every tail cluster for every token against the default, and each step's
    unprofiled time and XLA's planned temporaries."""
    columns = {"dense tails": dict(tail_capacity=0.0), "default": dict(tail_capacity=args.tail_capacity)}
    results = {}
    for name, kw in columns.items():
        run, step, state, batch_args = paper_runner(config, args.batch, **kw)
        results[name] = profile(run, step, state, batch_args, config, args.batch, args.steps)
    rows = [{"category": c, **{n: r["ms"][c] for n, r in results.items()}} for c in CATEGORIES]
    rows.append({"category": "sum (profiled)", **{n: sum(r["ms"].values()) for n, r in results.items()}})
    rows.append({"category": "step, unprofiled", **{n: r["step_ms"] for n, r in results.items()}})
    rows.append({"category": "temporaries, MiB", **{n: r["temp_mb"] for n, r in results.items()}})
    return rows


def alternating_pairs(config, args) -> list[dict]:
    """ms per step of each pair (tails, dropout keys' PRNG, dropout), its two steps timed in turns, then freed."""
    no_dropout = paper_config(args.layers, args.d_model, args.heads, args.mlp_dim)
    no_dropout.model.update(dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0))
    cap = dict(tail_capacity=args.tail_capacity)
    pairs = {"tails": ({"dense tails": (config, dict(tail_capacity=0.0)), "default": (config, cap)}),
             "dropout keys": ({"threefry": (config, cap), "rbg": (config, dict(cap, rng_impl="rbg"))}),
             "dropout": ({"dropout": (config, cap), "no dropout": (no_dropout, cap)})}
    timing = []
    for pair, runners in pairs.items():
        built = {n: paper_runner(c, args.batch, **kw)[0] for n, (c, kw) in runners.items()}
        per_s = common.interleaved_tokens_per_s(built, 1, args.rounds, warmup=1)  # steps per second
        seconds = {n: 1.0 / x for n, x in per_s.items()}
        (base, base_s), (other, other_s) = seconds.items()
        timing.append({"pair": pair, "a": base, "a_ms": base_s * 1e3, "b": other, "b_ms": other_s * 1e3,
                       "a / b": base_s / other_s})
    return timing


def main():
    keep_freed_host_memory()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d_model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp_dim", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tail_capacity", type=float, default=None, help="default: the model's")
    ap.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    config = paper_config(args.layers, args.d_model, args.heads, args.mlp_dim)
    rows = profiled_rows(config, args)
    print(f"paper model, {args.layers} layers, d={args.d_model}, {args.batch} x 512 tokens: ms per training step")
    common.print_table(rows, list(rows[0]))
    payload = {"model": dict(config.model), "vocab_size": WT103_VOCAB, "seq_len": config.train.seq_len,
               "batch": args.batch, "steps": args.steps, "rows": rows}
    if args.compare:
        timing = alternating_pairs(config, args)
        print("\ntimed alternately (pairs), unprofiled, ms per step:")
        common.print_table(timing, ["pair", "a", "a_ms", "b", "b_ms", "a / b"])
        payload["alternating"] = timing
    print(f"wrote {common.write('paper_step', payload)}")


if __name__ == "__main__":
    main()
