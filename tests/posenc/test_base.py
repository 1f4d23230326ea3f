"""The registry and the scheme interface: names, lookup, options, legacy names, documentation."""
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

import posenc


FIRST_SCHEMES = {"nope", "learned", "sinusoidal", "rope", "alibi", "t5"}


def test_registry_lists_schemes_and_rejects_unknown_names():
    assert FIRST_SCHEMES <= set(posenc.names())
    assert posenc.names() == sorted(posenc.names())
    with pytest.raises(ValueError) as err:
        posenc.get("alibee")
    for name in posenc.names():
        assert name in str(err.value)


def test_build_rejects_unknown_option():
    cfg = posenc.default_config("rope")
    cfg.rope.unlisted = 3
    dims = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_length=8)
    with pytest.raises(ValueError, match="unlisted.*base"):
        posenc.build(cfg, dims, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", posenc.names())
def test_every_scheme_documents_itself(name):
    cls = posenc.get(name)
    assert cls.__doc__ and len(cls.__doc__) > 60, "docstring with the formula and the citation"
    assert cls.family and cls.citation
    assert cls.extrapolates in ("yes", "partly", "with option", "no")


@pytest.mark.parametrize("name", ["conv", "complex_order", "floater", "cope", "logn", "randomized"])
def test_scheme_has_docstring_family_and_citation(name):
    cls = posenc.get(name)
    assert cls.__doc__ and cls.family and cls.citation


# --- legacy names: runs saved before a scheme was renamed ------------------------------------------
LEGACY_DIMS = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=1, train_length=8)


def test_legacy_names_resolve_to_the_registered_scheme_and_are_not_listed():
    assert posenc.LEGACY_NAMES == {"recurrent": "floater"}
    for old, new in posenc.LEGACY_NAMES.items():
        assert new in posenc.names() and old not in posenc.names()
        assert posenc.get(old) is posenc.get(new) and posenc.get(old).name == new
        assert posenc.canonical_name(old) == new and posenc.canonical_name(new) == new
    assert posenc.canonical_name("rope") == "rope"
    with pytest.raises(ValueError, match="old name of 'floater'"):
        posenc.register("recurrent")(posenc.get("floater"))  # a new scheme cannot take an old name


def test_a_block_saved_under_a_legacy_name_builds_with_its_options():
    options = {"steps_per_unit": 2, "hidden_dim": 8, "extra_positions": 3}
    saved = {"name": "recurrent", "recurrent": options, "rope": {"base": 10000.0}}  # as config.json has it
    scheme = posenc.build(saved, LEGACY_DIMS, rngs=nnx.Rngs(0))
    assert type(scheme) is posenc.get("floater") and scheme.name == "floater"
    assert (scheme.options.steps_per_unit, scheme.options.hidden_dim, scheme.options.extra_positions) == (2, 8, 3)
    assert posenc.used_schemes(saved) == ["recurrent"]
    posenc.check_option_key(saved, "posenc.recurrent.extra_positions")
    with pytest.raises(ValueError, match="no option 'nope'"):
        posenc.check_option_key(saved, "posenc.recurrent.nope")
    with pytest.raises(ValueError, match="names the scheme 'recurrent'.*posenc.recurrent.extra_positions"):
        posenc.check_option_key(saved, "posenc.floater.extra_positions")  # read from the block the run names
    current = posenc.canonical_config(saved)
    assert current == {"name": "floater", "floater": options, "rope": {"base": 10000.0}}
    assert saved["name"] == "recurrent" and "floater" not in saved  # a copy
    with pytest.raises(ValueError, match="names the scheme 'floater'.*posenc.floater.steps_per_unit"):
        posenc.check_option_key(current, "posenc.recurrent.steps_per_unit")
    again = posenc.build(current, LEGACY_DIMS, rngs=nnx.Rngs(0))
    assert again.options == scheme.options  # the same parameters under the same paths: checkpoints restore
    x, pos = jnp.zeros((1, 5, 16)), jnp.arange(5)[None]
    np.testing.assert_array_equal(again.embed(x, pos), scheme.embed(x, pos))


def test_legacy_names_in_default_config_wrappers_and_config_dicts():
    old = posenc.default_config("recurrent")  # spelled as a run saved under the old name
    assert old.name == "recurrent" and "floater" not in old
    assert old.recurrent.to_dict() == posenc.default_config("floater").floater.to_dict()
    assert posenc.canonical_config(old).to_dict() == posenc.default_config("floater").to_dict()
    wrapped = {"name": "logn", "logn": {"base": "recurrent"}, "recurrent": {"extra_positions": 5}}
    assert posenc.used_schemes(wrapped) == ["logn", "recurrent"]
    posenc.check_option_key(wrapped, "posenc.recurrent.extra_positions")
    assert posenc.build(wrapped, LEGACY_DIMS, rngs=nnx.Rngs(0)).inner.options.extra_positions == 5
    assert posenc.canonical_config(wrapped) == {"name": "logn", "logn": {"base": "floater"},
                                                "floater": {"extra_positions": 5}}
    both = ml_collections.ConfigDict({"name": "recurrent", "floater": {"extra_positions": 0, "hidden_dim": 4},
                                      "recurrent": {"extra_positions": 7}})
    current = posenc.canonical_config(both)  # the legacy block is what the run used
    assert isinstance(current, ml_collections.ConfigDict)
    assert current.to_dict() == {"name": "floater", "floater": {"extra_positions": 7, "hidden_dim": 4}}
    assert posenc.canonical_config(posenc.default_config("rope")).to_dict() == posenc.default_config("rope").to_dict()
