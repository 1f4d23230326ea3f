"""The registry's two halves: declarations (posenc/options/, read by config code without JAX) and
implementations (`@register` classes, imported on first use), which must name the same schemes."""
import dataclasses
import importlib
import pkgutil
import subprocess
import sys

import pytest

import posenc
from posenc import registry
from posenc.options.declare import DECLARED
from tests.conftest import REPO


def test_every_declared_scheme_is_registered_by_its_module_and_vice_versa():
    for name, declared in DECLARED.items():
        cls = posenc.get(name)
        assert cls.name == name and cls.__module__ == declared.module and cls.Options is declared.options
        assert cls.traits.wrapper == declared.wrapper
    for module in pkgutil.iter_modules(posenc.__path__):
        importlib.import_module(f"posenc.{module.name}")  # every class any module registers
    assert set(registry._CLASSES) == set(DECLARED) == set(posenc.names())


def test_register_refuses_a_class_its_declaration_does_not_describe():
    class Undeclared(posenc.Scheme):
        pass
    with pytest.raises(ValueError, match="'undeclared' is not declared"):
        registry.register("undeclared")(Undeclared)
    with pytest.raises(TypeError, match="declared with RopeOptions"):
        registry.register("rope")(Undeclared)  # checked before "registered twice" would be reached


def test_names_defaults_and_checks_load_no_jax():
    code = ("import sys, posenc, posenc.registry\n"
            "wrapped = posenc.wrapped(posenc.default_config('cope'), 'logn')\n"
            "posenc.check_options(wrapped); assert posenc.used_schemes(wrapped) == ['logn', 'cope']\n"
            "posenc.check_option_key(posenc.default_config('rope'), 'posenc.rope.base')\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'orbax', 'optax'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_every_option_class_is_a_frozen_dataclass_whose_defaults_build():
    for name, declared in DECLARED.items():
        assert dataclasses.is_dataclass(declared.options) and declared.options.__dataclass_params__.frozen, name
        assert posenc.default_config(name).name == name
