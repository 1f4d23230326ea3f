"""Traits (posenc/traits.py) say what a scheme's hooks do, so that attention can decide from them
alone: here every registered scheme, and the option sets and wrappers that change traits, is probed
through its hooks, and what the hooks do must be what the traits declare."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc
from posenc.registry import declaration

DIMS = posenc.ModelDims(d_model=16, num_heads=2, head_dim=8, num_layers=2, train_length=16)
T = 12
ROPE_OPTIONS = [{"rerope_window": 4}, {"self_extend_window": 4, "self_extend_group": 2},
                {"dca_chunk_size": 8, "dca_local_window": 2}, {"p_rope": 0.5},
                {"rerope_window": 4, "fraction": 0.0}]
WRAPPED = ("cope", "shaw", "alibi", "fox", "dape", "stickbreaking")
CASES = ([(name, {}) for name in posenc.names()]
         + [("rope", {"rope": options}) for options in ROPE_OPTIONS]
         + [("shaw", {"shaw": {"value_term": False}}), ("kerple_log", {"kerple_log": {"per_layer": True}}),
            ("kerple_power", {"kerple_power": {"per_layer": True}})]
         + [(wrapper, {wrapper: {"base": inner}}) for wrapper in posenc.wrapper_names() for inner in WRAPPED
            if not (wrapper == "dape" and inner in ("dape", "stickbreaking"))])  # refused: test_dape.py


def build(name: str, blocks: dict) -> posenc.Scheme:
    cfg = posenc.default_config(name)
    for block, options in blocks.items():
        cfg[block].update(options)
    return posenc.build(cfg, DIMS, rngs=nnx.Rngs(0))


def observed(scheme: posenc.Scheme) -> dict:
    """The traits that the hooks show on a small random input."""
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (1, T))
    q, k = (jax.random.normal(jax.random.key(s), (1, T, DIMS.num_heads, DIMS.head_dim)) for s in (1, 2))
    x = jax.random.normal(jax.random.key(3), (1, T, DIMS.d_model))
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(4), (1, DIMS.num_heads, T, T)), axis=-1)
    bias = scheme.bias(q, k, pos, pos)
    scale = scheme.logit_scale(pos, pos)
    try:
        scheme.carried_bias(q, k, pos, pos, jnp.zeros((1, DIMS.num_heads, T)))
        carries = True
    except NotImplementedError:
        carries = False
    found = {
        "value_term": scheme.value_bias(probs, pos, pos) is not None,
        "logit_scale": ("none" if scale is None else
                        "per_query" if jnp.ndim(scale) == 0 or jnp.shape(scale)[-1] == 1 else "per_pair"),
        "bias": "none" if bias is None else "function" if scheme.bias_fn() is not None else "tile",
        "reads_input": scheme.token_context(x, pos) is not None,
        "transforms_logits": scheme.transform_logits(probs, None, pos, pos) is not None,
        "samples_positions": bool((scheme.sample_positions(pos, jax.random.key(5)) != pos).any()),
        "carries_bias": carries,
        "wrapper": hasattr(scheme, "inner"),
        "needs_full_rows": False,
        "rotates_per_head": _rotates_per_head(scheme, pos),
    }
    if bias is not None:  # queries of the second half against keys of the first: the keys between are missing
        half = T // 2
        tile = scheme.bias(q[:, half:], k[:, :half], pos[:, half:], pos[:, :half])
        whole = jnp.broadcast_to(bias, (1, DIMS.num_heads, T, T))[:, :, half:, :half]
        found["needs_full_rows"] = not bool(jnp.allclose(jnp.broadcast_to(tile, whole.shape), whole, atol=1e-5))
    return found


def _rotates_per_head(scheme: posenc.Scheme, pos) -> bool:
    """Whether the same query and key in every head come out of `rotate` differing between heads."""
    x = jnp.broadcast_to(jax.random.normal(jax.random.key(6), (1, T, 1, DIMS.head_dim)), (1, T, DIMS.num_heads,
                                                                                       DIMS.head_dim))
    q, k = scheme.rotate(x, x, pos, pos)
    return not (bool(jnp.allclose(q, q[:, :, :1], atol=1e-6)) and bool(jnp.allclose(k, k[:, :, :1], atol=1e-6)))


@pytest.mark.parametrize("name,blocks", CASES, ids=[f"{n}-{b}" if b else n for n, b in CASES])
def test_traits_agree_with_what_the_hooks_do(name, blocks):
    scheme = build(name, blocks)
    traits = scheme.traits
    assert isinstance(traits, posenc.Traits)
    found = observed(scheme)
    declared = {field: getattr(traits, field) for field in found}
    assert found == declared
    assert traits.wrapper == declaration(name).wrapper
    if traits.bias == "function":
        assert scheme.bias_fn() is not None
    if traits.wrapper:  # the inner scheme's traits, with the flags the wrapper's class switches on
        own = type(scheme).traits
        for field in dataclasses.fields(posenc.Traits):
            if field.name not in ("wrapper", "bias"):
                expect = getattr(scheme.inner.traits, field.name) or getattr(own, field.name) is True
                assert getattr(traits, field.name) == expect, field.name


def test_options_and_wrappers_change_traits():
    assert build("rope", {}).traits == posenc.Traits()
    assert build("rope", {"rope": {"dca_chunk_size": 8, "dca_local_window": 2}}).traits.bias == "tile"
    assert build("shaw", {}).traits.value_term and not build("shaw", {"shaw": {"value_term": False}}).traits.value_term
    assert build("kerple_log", {"kerple_log": {"per_layer": True}}).traits.per_layer
    assert not build("kerple_log", {}).traits.per_layer
    assert build("ssmax", {"ssmax": {"base": "alibi"}}).traits == posenc.Traits(per_layer=True, wrapper=True,
                                                                                bias="function")
    assert build("dape", {"dape": {"base": "alibi"}}).traits.bias == "tile"  # the kernel cannot add it alone
    randomized = build("randomized", {"randomized": {"base": "cope"}}).traits
    assert randomized.samples_positions and randomized.needs_full_rows and randomized.carries_bias


def test_traits_refuse_values_they_do_not_know():
    with pytest.raises(ValueError, match="Traits.bias must be one of none, function, tile"):
        posenc.Traits(bias="dense")
    with pytest.raises(ValueError, match="needs_full_rows"):
        posenc.Traits(carries_bias=True)
    assert posenc.Traits(needs_full_rows=True).needs_whole_rows
    assert not posenc.Traits(needs_full_rows=True, carries_bias=True).needs_whole_rows
