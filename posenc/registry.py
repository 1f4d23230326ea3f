"""The registry of positional schemes, as config code sees it: names, defaults, checks. No JAX.

Each scheme is declared in posenc/options/ (its name, its `Options`, the module that implements it)
and implemented by a class in that module marked `@register(name)`. Everything here reads the
declarations only; `get(name)` imports the implementation (and with it JAX) on first use. Renamed
schemes keep their old names working (`LEGACY_NAMES`; `canonical_config(block)` rewrites a saved
`posenc` block to the registered names).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any

import ml_collections

from posenc import domains, options  # noqa: F401  (options: declares every scheme)
from posenc.options.declare import DECLARED, LEGACY_NAMES, Declaration, canonical_name, names

__all__ = ["LEGACY_NAMES", "canonical_config", "canonical_name", "check_option_key", "check_options", "declaration",
           "default_config", "get", "names", "options_of", "register", "used_schemes", "wrapped", "wrapper_names"]

log = logging.getLogger(__name__)

_CLASSES: dict[str, type] = {}  # name -> the class its module registered
_warned_legacy: set[str] = set()


def declaration(name: str) -> Declaration:
    """The declaration of `name` (or, with a one-time deprecation log, of what the legacy name `name`
    now is); unknown names raise a ValueError listing the valid ones."""
    if name in LEGACY_NAMES:
        if name not in _warned_legacy:
            _warned_legacy.add(name)
            log.warning("positional scheme %r is now called %r; the old name still works", name, LEGACY_NAMES[name])
        name = LEGACY_NAMES[name]
    try:
        return DECLARED[name]
    except KeyError:
        raise ValueError(
                f"unknown positional scheme {name!r}; registered schemes: {', '.join(names())}") from None


def register(name: str):
    """Class decorator: `@register("alibi")` on the class that implements the declared scheme `name`,
    with the declared `Options` and, for a wrapper, wrapper traits."""
    def wrap(cls: type) -> type:
        if name in LEGACY_NAMES:
            raise ValueError(f"positional scheme name {name!r} is the old name of {LEGACY_NAMES[name]!r} "
                             f"(LEGACY_NAMES): saved runs would resolve it to that one")
        if name not in DECLARED:
            raise ValueError(f"positional scheme {name!r} is not declared; declare it next to its Options in "
                             f"posenc/options/ (declare({name!r}, Options, {cls.__module__!r}))")
        declared = DECLARED[name]
        if cls.Options is not declared.options:
            raise TypeError(f"{cls.__name__}.Options is {cls.Options.__name__}, but {name!r} is declared with "
                            f"{declared.options.__name__}")
        if cls.traits.wrapper != declared.wrapper:
            raise TypeError(f"{cls.__name__}.traits.wrapper is {cls.traits.wrapper}, but {name!r} is declared "
                            f"with wrapper={declared.wrapper}")
        if name in _CLASSES:
            raise ValueError(f"positional scheme {name!r} is registered twice")
        domains.domains_of(cls.Options)  # its DOMAINS name its fields (posenc/domains.py)
        cls.name = name
        _CLASSES[name] = cls
        return cls
    return wrap


def get(name: str) -> type:
    """The scheme class registered as `name` (a legacy name: what it now is), its module imported on
    first use; unknown names raise a ValueError listing the valid ones."""
    declared = declaration(name)
    if declared.name not in _CLASSES:
        importlib.import_module(declared.module)
    if declared.name not in _CLASSES:
        raise LookupError(f"positional scheme {declared.name!r} is declared as implemented in {declared.module}, "
                          f"which registers no class under that name; add @register({declared.name!r}) there")
    return _CLASSES[declared.name]


def canonical_config(posenc_cfg: Any) -> Any:
    """A copy of a `posenc` block (dict or ConfigDict; the same type back) with every legacy scheme
    name replaced by the registered one: `name`, a wrapper's `base`, and the option blocks' keys.
    Where a block has both, the legacy block's options win (only a config written before the rename
    has one, and it holds what that run used)."""
    is_config = isinstance(posenc_cfg, ml_collections.ConfigDict)
    block = posenc_cfg.to_dict() if is_config else {key: posenc_cfg[key] for key in posenc_cfg.keys()}
    out = {key: dict(value) if isinstance(value, dict) else value
           for key, value in block.items() if key not in LEGACY_NAMES}
    for legacy, current in LEGACY_NAMES.items():
        if legacy in block:
            old = block[legacy]
            both = isinstance(old, dict) and isinstance(out.get(current), dict)
            out[current] = {**out[current], **old} if both else (dict(old) if isinstance(old, dict) else old)
    for value in out.values():
        if isinstance(value, dict) and isinstance(value.get("base"), str):
            value["base"] = canonical_name(value["base"])
    if isinstance(out.get("name"), str):
        out["name"] = canonical_name(out["name"])
    return ml_collections.ConfigDict(out) if is_config else out


def default_config(name: str = "alibi") -> ml_collections.ConfigDict:
    """`posenc` config block: the chosen `name` plus one sub-block of defaults per registered scheme,
    so that `--config.posenc.name=rope --config.posenc.rope.base=500000` works from any config.
    A legacy name gives the block as a run saved under it has it: that name and its option block
    (in place of the registered name's), so `cfg[name]` holds its defaults."""
    declaration(name)
    cfg = ml_collections.ConfigDict({"name": name})
    for scheme_name, declared in sorted(DECLARED.items()):
        fields = {f.name: getattr(declared.options(), f.name) for f in dataclasses.fields(declared.options)}
        if fields:
            cfg[name if canonical_name(name) == scheme_name else scheme_name] = fields
    return cfg


def used_schemes(posenc_cfg: Any) -> list[str]:
    """The schemes a `posenc` block runs: its `name` and, for wrappers, what they wrap (their `base`),
    outermost first. Options of any other scheme have no effect on the run. Names come as the block
    spells them (a legacy name stays legacy), so `posenc_cfg[name]` is each one's option block."""
    used = [posenc_cfg["name"]]
    while declaration(used[-1]).wrapper:
        block = posenc_cfg.get(used[-1], None) or {}
        inner = block.get("base", None) or declaration(used[-1]).options().base
        if inner in used:
            break
        used.append(inner)
    return used


def wrapper_names() -> list[str]:
    """The registered schemes that wrap another one (their option `base`): logn, randomized, ssmax, pose, dape."""
    return [name for name in names() if DECLARED[name].wrapper]


def wrapped(posenc_cfg: Any, wrapper: str) -> ml_collections.ConfigDict:
    """A copy of a `posenc` block with its scheme wrapped by `wrapper`, whose `base` is set to the
    block's scheme: `--set posenc.name=logn` at evaluation puts log-n scaling around a run trained
    without it. A wrapper holds its inner scheme as `inner`, so one that adds no parameters of its
    own (logn) leaves the checkpoint's parameters fitting the model. The block's own scheme named
    again changes nothing; a name that is not a wrapper is a ValueError naming the wrappers."""
    block = ml_collections.ConfigDict(posenc_cfg.to_dict() if hasattr(posenc_cfg, "to_dict") else dict(posenc_cfg))
    if canonical_name(wrapper) == canonical_name(block["name"]):
        return block
    if canonical_name(wrapper) not in wrapper_names():
        declaration(wrapper)  # an unknown name: the registry's error
        raise ValueError(f"posenc.name={wrapper}: the scheme of a trained run changes only to a wrapper of it "
                         f"({', '.join(wrapper_names())}); {wrapper!r} would need new parameters or a new training run")
    options = {**default_config(wrapper)[wrapper].to_dict(), **dict(block.get(wrapper, None) or {})}
    block[wrapper] = {**options, "base": block["name"]}
    block["name"] = wrapper
    return block


def check_option_key(posenc_cfg: Any, dotted: str) -> None:
    """`dotted` ('posenc.rope.pi_factor') must name an option of a scheme the block runs: a
    ValueError otherwise, saying which schemes the run uses and which options they have."""
    parts = dotted.split(".")
    if len(parts) < 2 or parts[0] != "posenc" or parts[1] == "name":
        return
    used = used_schemes(posenc_cfg)
    scheme = parts[1]
    if canonical_name(scheme) not in DECLARED:
        raise ValueError(f"{dotted}: unknown positional scheme {scheme!r}; registered schemes: {', '.join(names())}")
    spelled = [u for u in used if u != scheme and canonical_name(u) == canonical_name(scheme)]
    if spelled:  # old and new name of one scheme: its options are read from the block the run names
        raise ValueError(f"{dotted}: this run names the scheme {spelled[0]!r} ({scheme!r} and {spelled[0]!r} are "
                         f"one scheme, renamed); set posenc.{spelled[0]}.{'.'.join(parts[2:])} instead, or name "
                         f"it {canonical_name(scheme)!r} throughout")
    if scheme not in used:
        raise ValueError(f"{dotted} has no effect: this run uses {' -> '.join(used)}, not {scheme}; "
                         f"drop the option (or set posenc.name={scheme})")
    valid = sorted(f.name for f in dataclasses.fields(declaration(scheme).options))
    if len(parts) > 2 and parts[2] not in valid:
        raise ValueError(f"{dotted}: positional scheme {scheme!r} has "
                         + (f"no option {parts[2]!r}; valid: {', '.join(valid)}" if valid else "no options"))


def check_options(posenc_cfg: Any) -> None:
    """Every option of every scheme the block runs has its type and lies in its declared domain
    (posenc/domains.py: `Options.DOMAINS`); a DomainError names `posenc.<scheme>.<option>` and a
    valid value. Blocks of schemes the run does not use are not looked at (they have no effect)."""
    for name in used_schemes(posenc_cfg):
        given = posenc_cfg.get(name, None) or {}
        given = given.to_dict() if hasattr(given, "to_dict") else dict(given)
        domains.check(declaration(name).options, given, f"posenc.{name}")


def options_of(posenc_cfg: Any) -> Any:
    """The `Options` of the scheme a `posenc` block names, from its option block: unknown options
    are a ValueError listing the valid ones, values outside their domain a DomainError."""
    name = posenc_cfg["name"]
    options = declaration(name).options
    given = dict(posenc_cfg.get(name, None) or {})
    valid = {f.name for f in dataclasses.fields(options)}
    unknown = set(given) - valid
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for positional scheme {name!r}; "
                         f"valid options: {sorted(valid) or 'none'}")
    domains.check(options, given, f"posenc.{name}")
    return options(**given)
