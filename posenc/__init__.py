"""Registry of positional schemes: `names()`, `get(name)`, `build(cfg, dims, rngs=...)`.

Renamed schemes keep their old names working (`LEGACY_NAMES`; `canonical_config(block)` rewrites a
saved `posenc` block to the registered names).

Importing this package loads no JAX: the names, defaults and config checks come from the
declarations (posenc/registry.py, posenc/options/); the scheme classes and the functions below that
compute with JAX are imported on first use (`get(name)` imports the scheme's module).
"""
from posenc.domains import DomainError
from posenc.lazy import lazy_attributes
from posenc.registry import (LEGACY_NAMES, canonical_config, canonical_name, check_option_key, check_options,
                             default_config, get, names, register, used_schemes, wrapped, wrapper_names)
from posenc.traits import Traits

_LAZY = {  # public name -> the module that defines it (JAX), imported on first use
    "BiasFunction": "posenc.kernel_bias", "LengthError": "posenc.base", "ModelDims": "posenc.base",
    "Scheme": "posenc.base", "build": "posenc.base",
    "sinusoidal_table": "posenc.absolute", "fairseq_sinusoidal_table": "posenc.absolute",
    "rope_inverse_frequencies": "posenc.rope_scaling", "scaled_inverse_frequencies": "posenc.rope_scaling",
    "yarn_mscale": "posenc.rope_scaling", "rope_mscale": "posenc.rope_scaling",
    "apply_rotary": "posenc.rotary", "xpos_zeta": "posenc.rotary",
    "alibi_slopes": "posenc.bias", "t5_relative_position_bucket": "posenc.bias",
    "sandwich_compression": "posenc.sandwich", "sinusoid_inner_product": "posenc.sandwich",
    "binary_digits": "posenc.naive", "hierarchical_positions": "posenc.hierarchical",
}

__all__ = ["DomainError", "LEGACY_NAMES", "Traits", "canonical_config", "canonical_name", "check_option_key",
           "check_options", "default_config", "get", "names", "register", "used_schemes", "wrapped",
           "wrapper_names", *_LAZY]

# the JAX parts of the public face (and submodules such as `posenc.rope_scaling`), on first use
__getattr__ = lazy_attributes(__name__, _LAZY, submodules=True)
