"""The table of schemes in docs/schemes.md, generated from the registry (so it cannot drift from the code).

    python -m posenc.catalogue            # print the table
    python -m posenc.catalogue --write docs/schemes.md   # replace the table between its markers (tests/test_docs.py)
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib

import jax
from flax import nnx

from posenc.base import ModelDims, Scheme, build
from posenc.registry import default_config, get, names

HOOKS = ("embed", "rotate", "bias", "bias_fn", "value_bias", "logit_scale", "sample_positions", "token_context",
         "context_bias", "transform_logits")
START, END = "<!-- schemes:start -->", "<!-- schemes:end -->"
_DIMS = ModelDims(d_model=64, num_heads=4, head_dim=16, num_layers=2, train_length=128)


def hooks_of(cls: type[Scheme]) -> list[str]:
    """The hooks a scheme overrides, and its attention weights where they are not a softmax."""
    hooks = [f"`{h}`" for h in HOOKS if hasattr(Scheme, h) and getattr(cls, h) is not getattr(Scheme, h)]
    weights = cls.traits.normalization
    return hooks + ([f"weights: {weights}"] if weights != "softmax" else [])


def learned_parameters(name: str) -> str:
    """Names and shapes of a scheme's parameters at d=64, 4 heads, L=128 (built abstractly)."""
    abstract = nnx.eval_shape(lambda: build(default_config(name), _DIMS, rngs=nnx.Rngs(0)))
    leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.state(abstract, nnx.Param))
    parts = []
    for path, leaf in leaves:
        keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        keys = [k for k in keys if k and k != "value"]
        parts.append(f"{'.'.join(keys)} {tuple(leaf.shape)}")
    return ", ".join(parts) or "none"


def markdown_table() -> str:
    lines = ["| name | family | hooks | learned parameters (d=64, 4 heads, L=128) | extrapolates beyond L | citation |",
             "|---|---|---|---|---|---|"]
    for name in names():
        cls = get(name)
        per_layer = " (per layer)" if cls.traits.per_layer else ""
        if "per_layer" in {f.name for f in dataclasses.fields(cls.Options)}:
            per_layer = " (shared by all layers; option `per_layer`)"
        lines.append(f"| `{name}` | {cls.family or '-'} | {', '.join(hooks_of(cls)) or '-'} | "
                     f"{learned_parameters(name)}{per_layer} | {cls.extrapolates or '-'} | {cls.citation or '-'} |")
    return "\n".join(lines)


def replace_in(path: pathlib.Path) -> None:
    text = path.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{START}\n{markdown_table()}\n{END}{tail}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", help="file whose table (between the markers) to replace")
    args = ap.parse_args()
    if args.write:
        replace_in(pathlib.Path(args.write))
    else:
        print(markdown_table())
