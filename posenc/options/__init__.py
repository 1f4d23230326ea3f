"""Every positional scheme's options, free of JAX: one module per family, each declaring its
schemes (posenc/options/declare.py) next to their `Options` dataclasses. Importing this package (or
any module in it) declares them all; posenc/registry.py answers the questions config code asks."""
from posenc.options import absolute, bias, content, rotary, wrappers  # noqa: F401  (declare their schemes)
