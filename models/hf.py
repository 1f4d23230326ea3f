"""`models.hf`, the public name of the checkpoint loader and exporter, which live in
models/formats/hf.py: `from models import hf; hf.load(...)` keeps working."""
from models.formats.hf import ARCHITECTURES, HFError, export, load, load_checkpoint, posenc_config

__all__ = ["load", "load_checkpoint", "export", "HFError", "ARCHITECTURES", "posenc_config"]
