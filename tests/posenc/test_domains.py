"""Option domains (posenc/domains.py): declared next to every options dataclass, checked once when
a config is resolved, and an error that names the option and gives a value that is valid."""
import dataclasses
import re

import ml_collections
import pytest

import posenc
from experiment import config as config_lib
from models.config import ModelConfig
from posenc import domains
from tests.conftest import tiny_config

OPTION_CLASSES = ([(f"posenc.{name}", posenc.get(name).Options) for name in posenc.names()]
                  + [(name, cls) for name, cls in config_lib.SECTIONS.items()] + [("model", ModelConfig)])


def numeric(field) -> bool:
    return isinstance(field.default, (int, float)) and not isinstance(field.default, bool)


@pytest.mark.parametrize("where,cls", OPTION_CLASSES, ids=[w for w, _ in OPTION_CLASSES])
def test_every_numeric_option_declares_a_domain_its_default_lies_in(where, cls):
    declared = domains.domains_of(cls)  # also: every name it declares is a field
    missing = [f.name for f in dataclasses.fields(cls) if numeric(f) and f.name not in declared
               and not (cls is ModelConfig and f.name == "vocab_size")]
    assert not missing, f"{where}: numeric options without a domain in DOMAINS: {missing}"
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    domains.check(cls, defaults, where)


def resolve_error(change) -> str:
    """The DomainError message of the tiny config after `change(config)`."""
    config = tiny_config("alibi")
    change(config)
    with pytest.raises(posenc.DomainError) as error:
        config_lib.resolve(config)
    return str(error.value)


def set_key(dotted: str, value):
    def change(config):
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    return change


def with_scheme(name: str, dotted: str, value):
    def change(config):
        config.posenc.name = name
        set_key(dotted, value)(config)
    return change


CASES = [  # (change, the message's start): item 9 of issue 22 first (a negative rate trained by gradient ascent)
    (set_key("train.lr", -0.01), "train.lr must be > 0, got -0.01"),
    (set_key("train.lr", float("nan")), "train.lr must be a finite number, got nan"),
    (set_key("train.batch_size", 0), "train.batch_size must be >= 1"),
    (set_key("train.optimizer", "sgd"), "train.optimizer must be one of adamw, nag"),
    (set_key("model.dropout", 1.0), "model.dropout must be in [0, 1)"),
    (set_key("model.attention", "flash"), "model.attention must be one of auto, dense"),
    (set_key("eval.length_multipliers", (1, -2)), "eval.length_multipliers must be a sequence of numbers each > 0"),
    (set_key("data.passkey_fraction", 1.5), "data.passkey_fraction must be in [0, 1]"),
    (set_key("seed", -1), "seed must be >= 0"),
    (with_scheme("t5", "posenc.t5.num_buckets", 0), "posenc.t5.num_buckets must be >= 2"),
    (with_scheme("t5", "posenc.t5.max_distance", 16), "posenc.t5.max_distance must be > the exact distances"),
    (with_scheme("logn", "posenc.rope.yarn_scale", 0.5), "posenc.rope.yarn_scale must be >= 1"),  # what logn wraps
    (with_scheme("sandwich", "posenc.sandwich.dim", 3), "posenc.sandwich.dim must be 0 (the head dimension) or"),
    (with_scheme("kerple_power", "posenc.kerple_power.r2_init_max", 2.5), "posenc.kerple_power.r2_init_max must be"),
    # issue 32: an option that acts only with another, given alone, was recorded as a result of its own
    (with_scheme("rope", "posenc.rope.dca_local_window", 8), "posenc.rope.dca_local_window must be 0 unless "
     "dca_chunk_size (Dual Chunk Attention) is set too (alone it has no effect), got 8"),
    (with_scheme("rope", "posenc.rope.self_extend_group", 4), "posenc.rope.self_extend_group must be 1 unless "
     "self_extend_window is set too"),
    (with_scheme("rope", "posenc.rope.dynamic_ntk_factor", 2.0), "posenc.rope.dynamic_ntk_factor must be 1.0 unless "
     "dynamic_ntk is set too"),
    (with_scheme("rope", "posenc.rope.yarn_beta_fast", 16.0), "posenc.rope.yarn_beta_fast must be 32.0 unless "
     "yarn_scale (or yarn_dynamic) is set too"),
    (with_scheme("rope", "posenc.rope.llama3_low_freq_factor", 2.0), "posenc.rope.llama3_low_freq_factor must be 1.0"),
    (with_scheme("rope", "posenc.rope.longrope_factor", 4.0), "posenc.rope.longrope_factor must be 1.0 unless "
     "longrope_short_factor / long_factor is set too"),
    (with_scheme("rope", "posenc.rope.xpos_scale_base", 256.0), "posenc.rope.xpos_scale_base must be 512.0 unless "
     "xpos is set too"),
]


@pytest.mark.parametrize("change,expected", CASES, ids=[e.split(" must")[0] for _, e in CASES])
def test_a_value_outside_its_domain_is_refused_by_name_with_a_valid_value_that_resolves(change, expected):
    message = resolve_error(change)
    assert message.startswith(expected), message
    key, valid = re.search(r"a valid value: ([\w.]+)=(.*)$", message).groups()
    config = tiny_config("alibi")
    change(config)
    default = config_lib.typed(tiny_config("alibi")).to_dict()
    for part in key.split("."):
        default = default[part]
    set_key(key, config_lib.converted(default, valid, "test"))(config)
    config_lib.resolve(config)  # the value the message suggests is accepted


def test_an_option_that_acts_only_with_another_is_refused_alone_at_evaluation_and_taken_with_it():
    """Issue 32: --set posenc.rope.dca_local_window=8 without a chunk size was scored as plain rope
    and drawn as a series of its own."""
    from experiment.evals.common import apply_overrides
    config = tiny_config("rope")
    with pytest.raises(posenc.DomainError, match=r"^posenc.rope.dca_local_window must be 0 unless dca_chunk_size "
                                                 r".*; a valid value: posenc.rope.dca_local_window=0$"):
        apply_overrides(config, {"posenc.rope.dca_local_window": "8"})
    both = apply_overrides(config, {"posenc.rope.dca_chunk_size": "12", "posenc.rope.dca_local_window": "8"})
    assert (both.posenc.rope.dca_chunk_size, both.posenc.rope.dca_local_window) == (12, 8)
    with pytest.raises(posenc.DomainError, match="posenc.rope.dca_local_window must be >= 0"):
        apply_overrides(config, {"posenc.rope.dca_chunk_size": "12", "posenc.rope.dca_local_window": "-1"})


def test_types_are_checked_too_and_unused_schemes_are_not_looked_at():
    config = config_lib.typed(tiny_config("alibi")).to_dict()
    config["train"]["steps"] = 2.5
    with pytest.raises(posenc.DomainError, match=r"train.steps must be a whole number, got 2.5"):
        config_lib.resolve(config)
    config["train"]["steps"] = True
    with pytest.raises(posenc.DomainError, match=r"train.steps must be a whole number, got True"):
        config_lib.resolve(config)
    config["train"]["steps"] = 2
    config["posenc"]["t5"]["num_buckets"] = -1  # alibi's run: t5's options have no effect, so no error
    config_lib.resolve(config)
    with pytest.raises(posenc.DomainError, match="posenc.t5.num_buckets"):  # building t5 checks them too
        posenc.build(ml_collections.ConfigDict({"name": "t5", "t5": {"num_buckets": -1}}),
                     posenc.ModelDims(32, 4, 8, 2, 16), rngs=None)


@pytest.mark.parametrize("old,raw,expected", [
    (600, "25", 25), (2e-3, "1e-4", 1e-4), (2e-3, "3", 3.0), (True, "no", False), ((64,), "128,256", (128, 256)),
    ((), "1.5,2", (1.5, 2)), ("fairseq", "vaswani", "vaswani")])
def test_grid_and_set_values_take_the_type_of_the_option(old, raw, expected):
    value = config_lib.converted(old, raw, "--grid k")
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("old,raw,expected", [
    (600, "abc", "--grid train.steps=abc: 'abc' is not a whole number (e.g. 600)"),
    (600, "2.5", "'2.5' is not a whole number"), (2e-3, "fast", "'fast' is not a number"),
    (True, "maybe", "'maybe' is not true or false"), ((64,), "64,x", "'x' is not a whole number")])
def test_a_value_of_the_wrong_type_names_the_flag_and_the_option(old, raw, expected):
    """Issue 22, item 13: `invalid literal for int()` said neither."""
    with pytest.raises(ValueError, match=re.escape(expected)):
        config_lib.converted(old, raw, f"--grid train.steps={raw}")
