"""Where each scheme is declared: its name, its `Options` and the module that implements it.

The family modules of this package call `declare` next to each Options dataclass; importing any of
them imports the package, which imports every family, so `DECLARED` is complete whenever one is
used. posenc/registry.py reads it (names, defaults, config checks: no JAX); the implementation's
`@register(name)` (posenc/registry.py) attaches the class, imported only when `get(name)` asks.
"""
from __future__ import annotations

import dataclasses

from posenc.domains import satisfies


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A scheme without options."""


@dataclasses.dataclass(frozen=True)
class Declaration:
    """A declared scheme: `options` (a frozen dataclass of defaults with `DOMAINS`), the module whose
    `@register(name)` class implements it, and whether it wraps another scheme (its option `base`)."""
    name: str
    options: type
    module: str
    wrapper: bool = False


# Old name -> registered name, for schemes that were renamed: a run saved under the old name (its
# config.json has `"posenc": {"name": "recurrent", "recurrent": {...options}}`) still loads, builds
# and evaluates. `names()` lists only registered names; `canonical_config` rewrites a saved block.
LEGACY_NAMES: dict[str, str] = {
    "recurrent": "floater",  # FLOATER (Liu et al. 2020) was registered as "recurrent" until it got its paper's name
}

DECLARED: dict[str, Declaration] = {}


def declare(name: str, options: type, module: str, *, wrapper: bool = False) -> None:
    """Declare the scheme `name` with its Options, implemented in `module` (e.g. "posenc.rotary")."""
    if name in DECLARED:
        raise ValueError(f"positional scheme {name!r} is declared twice")
    if name in LEGACY_NAMES:
        raise ValueError(f"positional scheme name {name!r} is the old name of {LEGACY_NAMES[name]!r} "
                         f"(LEGACY_NAMES): saved runs would resolve it to that one")
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"{options.__name__} (the options of {name!r}) must be a frozen dataclass")
    if wrapper and "base" not in {f.name for f in dataclasses.fields(options)}:
        raise TypeError(f"{options.__name__}: a wrapper's options name the wrapped scheme in `base`")
    DECLARED[name] = Declaration(name, options, module, wrapper)


def canonical_name(name: str) -> str:
    """The registered name of `name`: itself, or what a legacy name (LEGACY_NAMES) now is."""
    return LEGACY_NAMES.get(name, name)


def names() -> list[str]:
    """Every declared scheme, sorted (legacy names are not listed)."""
    return sorted(DECLARED)


# The domain of a wrapper's `base`: a declared scheme (or a legacy name of one).
REGISTERED = satisfies(lambda v, _: canonical_name(v) in names(),
                       lambda _: f"a registered positional scheme ({', '.join(names())})", "rope")
