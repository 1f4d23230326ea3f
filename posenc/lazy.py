"""The `__getattr__` of a package whose public names live in modules it imports only when a name is
first read, so that importing the package (or one module of it) loads none of the others: the
packages' faces (posenc, models, models.attention, experiment.evals, experiment.report) keep JAX,
or the kernels, out of what a config, a report or a JAX-free module reaches. Here, in the package
at the ground (posenc imports nothing of the project's), so that every package may use it."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable


def lazy_attributes(package: str, names: dict[str, str], submodules: bool = False) -> Callable[[str], Any]:
    """`__getattr__` for `package`: each of `names` ({name: module}, a module starting with "." is
    relative to `package`) imported from its module when first read and kept in the package; with
    `submodules`, any other name of one of its modules is that module (`posenc.rope_scaling`)."""
    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
            setattr(sys.modules[package], name, value)
            return value
        if submodules and not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
