"""Registry of positional schemes: `names()`, `get(name)`, `build(cfg, dims, rngs=...)`.

Importing this package registers every scheme family below.
"""
from posenc.base import (LengthError, ModelDims, Scheme, build, default_config, get, names,
                         register)
from posenc.absolute import sinusoidal_table
from posenc.rotary import apply_rotary, rope_inverse_frequencies
from posenc.bias import alibi_slopes, t5_relative_position_bucket

__all__ = [
    "LengthError", "ModelDims", "Scheme", "build", "default_config", "get", "names", "register",
    "sinusoidal_table", "apply_rotary", "rope_inverse_frequencies", "alibi_slopes",
    "t5_relative_position_bucket",
]
