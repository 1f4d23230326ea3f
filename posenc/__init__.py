"""Registry of positional schemes: `names()`, `get(name)`, `build(cfg, dims, rngs=...)`.

Renamed schemes keep their old names working (`LEGACY_NAMES`; `canonical_config(block)` rewrites a
saved `posenc` block to the registered names).

Importing this package registers every scheme family below.
"""
from posenc.base import (LEGACY_NAMES, BiasFunction, LengthError, ModelDims, Scheme, build, canonical_config,
                         canonical_name, check_option_key, check_options, default_config, get, names, register,
                         used_schemes, wrapped, wrapper_names)
from posenc.domains import DomainError
from posenc.absolute import fairseq_sinusoidal_table, sinusoidal_table
from posenc.rope_scaling import rope_inverse_frequencies, rope_mscale, scaled_inverse_frequencies, yarn_mscale
from posenc.rotary import apply_rotary, xpos_zeta
from posenc.bias import alibi_slopes, t5_relative_position_bucket
from posenc.sandwich import sandwich_compression, sinusoid_inner_product
from posenc.naive import binary_digits
from posenc.hierarchical import hierarchical_positions
from posenc import fire, kerple, multiplicative  # noqa: F401  (registers their schemes)

__all__ = [
    "BiasFunction", "DomainError", "LengthError", "ModelDims", "Scheme", "build", "check_option_key", "check_options",
    "default_config", "get", "names",
    "register", "used_schemes", "wrapped", "wrapper_names", "LEGACY_NAMES", "canonical_name", "canonical_config",
    "sinusoidal_table", "fairseq_sinusoidal_table", "apply_rotary", "rope_inverse_frequencies", "scaled_inverse_frequencies",
    "xpos_zeta", "yarn_mscale", "rope_mscale", "alibi_slopes", "t5_relative_position_bucket",
    "sandwich_compression", "sinusoid_inner_product", "binary_digits", "hierarchical_positions",
]
from posenc import relative_content  # noqa: F401,E402  (registers shaw, transformer_xl, deberta, tupe)
from posenc import complex_order, conv, cope, floater, wrappers  # noqa: F401,E402  (register their schemes)
from posenc import fope, pope, pose  # noqa: F401,E402  (register fope, pope and pose)
from posenc import dape, fox, stickbreaking  # noqa: F401,E402  (register dape, fox, stickbreaking)
