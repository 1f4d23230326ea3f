"""Option domains: the values each option of a config may take, declared next to the frozen
dataclass that holds the option's default, and checked once where a config is resolved.

One mechanism for every kind of option (a scheme's `Options`, the model's `ModelConfig`, the
experiment config's sections in experiment/config.py):

    @dataclasses.dataclass(frozen=True)
    class T5Options:
        num_buckets: int = 32
        max_distance: int = 128
        bidirectional: bool = False
        DOMAINS = {"num_buckets": at_least(2),
                   "max_distance": above(lambda o: t5_max_exact(o), "num_buckets // 2 (// 4 bidirectional)")}

`check(cls, values, where)` checks every field of `cls` in `values`:
- its type, from the field's default (an int option takes a whole number, a float one any finite
  number, a bool one only True / False, a tuple one a sequence), for every field, declared or not;
- its domain, where `DOMAINS` declares one (a range, a set of choices, a condition on other options;
  `only_with`: an option that acts only together with another is refused alone).
The error names the option (`where.field`), says what is valid, and gives a valid value, so the
message fits a --config flag, a --set override or a damaged config.json alike. Why here: a value
outside its domain otherwise trains (a negative learning rate climbs the loss) or fails deep in JAX.

Numeric options must declare a domain (tests/posenc/test_domains.py checks every registered
scheme and every config section), so a new option cannot skip the check.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping


class DomainError(ValueError):
    """An option's value lies outside its type or domain; the message names the option and a valid value."""


@dataclasses.dataclass(frozen=True)
class Domain:
    """`test(value, options)` says whether `value` is valid given all the options of its section
    (a mapping: field -> value); `text` says what is valid and `example` gives a valid value (each
    either fixed or a function of the options)."""
    test: Callable[[Any, Mapping], bool]
    text: str | Callable[[Mapping], str]
    example: Any | Callable[[Mapping], Any] = None

    def describe(self, options: Mapping) -> str:
        return self.text(options) if callable(self.text) else self.text

    def valid_value(self, options: Mapping, default: Any) -> Any:
        """The option's default where it is valid with the other options, else the example."""
        if self.example is None or self.test(default, options):
            return default
        return self.example(options) if callable(self.example) else self.example


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def between(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
            example: Any = None, note: str = "") -> Domain:
    """A finite number in [lo, hi] (an end left None is unbounded; `*_open` excludes it)."""
    def test(v, _):
        return (_number(v) and (lo is None or (v > lo if lo_open else v >= lo))
                and (hi is None or (v < hi if hi_open else v <= hi)))
    if lo is not None and hi is not None:
        text = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    elif lo is not None:
        text = f"{'>' if lo_open else '>='} {lo:g}"
    elif hi is not None:
        text = f"{'<' if hi_open else '<='} {hi:g}"
    else:
        text = "a finite number"
    return Domain(test, text + (f" ({note})" if note else ""), example)


def at_least(lo: float, *, example: Any = None, note: str = "") -> Domain:
    return between(lo, example=example, note=note)


def positive(*, example: Any = None, note: str = "") -> Domain:
    return between(0, lo_open=True, example=example, note=note)


def unit_interval(*, hi_open: bool = False, example: Any = None, note: str = "") -> Domain:
    """A share: [0, 1] (or [0, 1) with `hi_open`)."""
    return between(0, 1, hi_open=hi_open, example=example, note=note)


def one_of(*choices: Any, note: str = "") -> Domain:
    return Domain(lambda v, _: v in choices, f"one of {', '.join(map(str, choices))}" + (f" ({note})" if note else ""),
                  choices[0])


def each(domain: Domain) -> Domain:
    """A sequence whose every element lies in `domain` (empty allowed)."""
    return Domain(lambda v, o: all(domain.test(x, o) for x in v),
                  lambda o: f"a sequence of numbers each {domain.describe(o)}", ())


def above(bound: Callable[[Mapping], float], what: str) -> Domain:
    """A number greater than a function of the section's other options (`what` names it)."""
    return Domain(lambda v, o: _number(v) and v > bound(o), lambda o: f"> {what} = {bound(o):g}",
                  lambda o: int(bound(o)) + 1)


def only_with(on: Callable[[Mapping], bool], what: str, domain: Domain, off: Any) -> Domain:
    """An option that acts only together with another (`on(options)`: whether that one is set; `what`
    names it): alone it must keep its `off` value (any other would be recorded in a run or a record
    that it did not change), with it a value in `domain`."""
    return Domain(lambda v, o: domain.test(v, o) if on(o) else v == off,
                  lambda o: domain.describe(o) if on(o) else f"{off} unless {what} is set too (alone it has no effect)",
                  lambda o: (domain.example(o) if callable(domain.example) else domain.example) if on(o) else off)


def satisfies(test: Callable[[Any, Mapping], bool], text: str | Callable[[Mapping], str],
              example: Any = None) -> Domain:
    """Any other condition, as a predicate of (value, options); `text` may be a function of the options."""
    return Domain(test, text, example)


# --- checking ----------------------------------------------------------------------------------

def _type_error(value, default) -> str | None:
    """What is wrong with `value`'s type for a field whose default is `default` (None if fine)."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "True or False"
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else "a whole number"
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "a finite number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "text"
    if isinstance(default, tuple):
        return None if isinstance(value, (tuple, list)) else "a sequence, e.g. 1,2"
    return None


def domains_of(cls) -> dict[str, Domain]:
    """The declared domains of a dataclass (`DOMAINS`), each key checked to be one of its fields."""
    declared = dict(getattr(cls, "DOMAINS", None) or {})
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(declared) - fields)
    if unknown:
        raise TypeError(f"{cls.__name__}.DOMAINS names {unknown}, which are not fields of it")
    return declared


def check(cls, values: Mapping[str, Any], where: str) -> None:
    """Every field of dataclass `cls` present in `values` has the field's type and lies in its
    declared domain; otherwise a DomainError naming `where.field` (`field` where `where` is ''),
    what is valid and a valid value."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    merged = {**defaults, **values}
    domains = domains_of(cls)
    for name, value in values.items():
        if name not in defaults:
            continue
        wrong_type = _type_error(value, defaults[name])
        domain = domains.get(name)
        if wrong_type is None and (domain is None or domain.test(value, merged)):
            continue
        text = wrong_type if wrong_type is not None else domain.describe(merged)
        example = domain.valid_value(merged, defaults[name]) if domain is not None else defaults[name]
        key = f"{where}.{name}" if where else name
        raise DomainError(f"{key} must be {text}, got {value!r}; a valid value: {key}={_spelled(example)}")


def _spelled(value) -> str:
    """A value as it is written on the command line (tuples as 1,2)."""
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) if value else "()"
    return str(value)
