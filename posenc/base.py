"""The positional-scheme interface and its registry.

A scheme is an `nnx.Module` registered by name. It overrides only the hooks it needs; the defaults
below are the identity (or `None`, meaning "no contribution"). Every hook takes explicit integer
positions, never "the length seen so far", so that sliding windows, offsets and interpolation are
just different position arrays. `bias` works on one (query block, key block) tile so that blockwise
attention can call it per tile without a full T x T matrix ever existing outside attention.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
import ml_collections

from posenc import domains

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelDims:
    """What a scheme may need to know about the model it sits in."""
    d_model: int
    num_heads: int
    head_dim: int
    num_layers: int
    train_length: int  # the training sequence length L


class LengthError(ValueError):
    """A scheme cannot evaluate at the requested length; the message names the option that fixes it."""


def check_table_length(scheme_name: str, rows: int, length: int, detail: str = "") -> None:
    """The LengthError of a scheme with a learned table of `rows` positions (option max_length)."""
    if length > rows:
        raise LengthError(
            f"positional scheme {scheme_name!r}{detail} has a table of {rows} positions but length {length} "
            f"was requested; train with --config.posenc.{scheme_name}.max_length={length} (or larger), "
            f"or evaluate at lengths <= {rows}")


@dataclasses.dataclass(frozen=True)
class BiasFunction:
    """An additive logits bias as a function of positions, for kernels that compute it tile by tile
    and never materialise it (models/attention/pallas.py).

    `fn(shared, head, q_pos_Qx1, k_pos_1xS) -> Q x S` (float32) is the bias of one head: `shared`
    is the pytree `shared` as given, `head` the pytree `per_head` with every leaf sliced at one head
    (each `per_head` leaf has a leading axis of length num_heads). Leaves reach `fn` at least 1-d
    (a scalar as shape (1,), one head's scalar as (1,)), so write `fn` with broadcasting. `fn` must
    be elementwise arithmetic on its position arguments and depend on the leaves only (not on
    arrays it closes over; Python numbers are fine): it runs inside a GPU kernel, which cannot
    gather, reduce over keys or index into a vector, so a vector of coefficients is given as a
    tuple of leaves, one per element (tests/models/attention/test_pallas.py lowers every scheme's). Where
    `learned`, the kernel returns the leaves' gradients, through which the scheme's parameters get
    theirs; parameter-free biases set it False and skip that work. A learned lookup table (T5's
    buckets) goes in `table` with its elementwise `index` function instead of `fn` (or beside it):
    kernels gather it, and sum dS per entry for its gradient. `constant_beyond` = D says that the
    bias is one value per head wherever q_pos - k_pos >= D (T5's last bucket): a tile lying wholly
    that far back is then filled from one evaluation, and its gradient is one sum.
    """
    fn: Callable | None
    shared: Any = ()
    per_head: Any = ()
    learned: bool = True
    constant_beyond: int | None = None
    table: jax.Array | None = None   # H x N: plus table[head, index(q_pos_Qx1, k_pos_1xS)] (int32
    index: Callable | None = None    # Q x S in [0, N)), which a kernel gathers from memory

    def dense(self, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> jax.Array:
        """The whole bias, B x H x T x S, one head at a time (to check `fn` against `Scheme.bias`)."""
        lift = lambda x: jnp.reshape(x, (1,)) if jnp.ndim(x) == 0 else x
        shared = jax.tree.map(lift, self.shared)
        if self.table is not None:
            num_heads = self.table.shape[0]
        else:
            num_heads = len(jax.tree.leaves(self.per_head)[0]) if jax.tree.leaves(self.per_head) else 1
        heads = []
        for h in range(num_heads):
            head = jax.tree.map(lambda x: lift(x[h]), self.per_head)

            def one(q, k):
                out = jnp.zeros((q.shape[0], k.shape[0]), jnp.float32)
                if self.fn is not None:
                    out = out + self.fn(shared, head, q[:, None], k[None, :])
                if self.table is not None:
                    out = out + self.table[h][self.index(q[:, None], k[None, :])]
                return out
            heads.append(jax.vmap(one)(q_pos_BxT, k_pos_BxS))
        return jnp.stack(heads, axis=1).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A scheme without options."""


class Scheme(nnx.Module):
    """Base class: every hook is a no-op. Subclasses set `Options` (a frozen dataclass of defaults,
    with `DOMAINS` saying what each option may hold: posenc/domains.py)."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""        # "absolute" | "relative" | "none" | ...
    citation: ClassVar[str] = ""
    extrapolates: ClassVar[str] = ""  # beyond the training length: yes | partly | with option | no
    Options: ClassVar[type] = NoOptions
    # What the decoder and attention read off a scheme (a wrapper copies them from what it wraps):
    per_layer: ClassVar[bool] = False          # one instance per layer rather than one shared by all
    needs_full_rows: ClassVar[bool] = False    # a tile's bias depends on keys outside the tile (CoPE);
                                               # blockwise then needs `carried_bias`
    carries_bias: ClassVar[bool] = False       # `carried_bias` is implemented (see its docstring)
    bias_work_per_key: ClassVar[bool] = False  # `bias` does work per key that row tiles would repeat
                                               # for each key prefix: `auto` trains it with dense
    samples_positions: ClassVar[bool] = False  # `sample_positions` draws random positions
    reads_input: ClassVar[bool] = False        # `token_context` reads the layer's input (FoX): a bias
                                               # no kernel can compute from positions alone
    transforms_logits: ClassVar[bool] = False  # `transform_logits` is not scores + bias (DAPE)
    normalization: ClassVar[str] = "softmax"   # how logits become attention weights: "softmax", or
                                               # "stickbreaking" (models/attention/stickbreaking.py)

    def __init__(self, options: Any, dims: ModelDims, *, rngs: nnx.Rngs):
        self.options = options
        self.dims = dims

    # --- hooks -------------------------------------------------------------------------------------
    def embed(self, x_BxTxD: jax.Array, positions_BxT: jax.Array) -> jax.Array:
        """Token embeddings -> embeddings with absolute position information."""
        return x_BxTxD

    def rotate(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS):
        """Per layer, before the dot product (RoPE and its relatives)."""
        return q_BxTxHxK, k_BxSxHxK

    def bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """Additive logits bias for one tile, broadcastable to B x H x T x S (after 1/sqrt(d))."""
        return None

    def bias_fn(self) -> BiasFunction | None:
        """The same bias as `bias`, as a function of positions that a fused kernel evaluates per tile
        (see BiasFunction); None where the scheme has no bias or does not provide one. It must equal
        `bias` (tests/models/attention/test_pallas.py checks every scheme that provides it)."""
        return None

    def value_bias(self, probs_BxHxTxS, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """A term added to the attention output, B x T x H x K, computed from the tile's probabilities."""
        return None

    def logit_scale(self, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """Multiplier of the logits, broadcastable to B x H x T x S (per query)."""
        return None

    def token_context(self, x_BxTxD: jax.Array, positions_BxT: jax.Array) -> jax.Array | None:
        """Per-token values computed once per layer from the layer's input (after its norm) and the
        positions, B x T x C, which attention slices along with q and k and hands to
        `context_bias` tile by tile; None (the default): the scheme reads no input. Computed over
        the whole sequence before any tiling, so a running sum over tokens (FoX's forget gates)
        is the same whichever tile reads it; positions increase along the sequence, as every
        attention path's causal order assumes."""
        return None

    def context_bias(self, q_ctx_BxTxC, k_ctx_BxSxC, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """Additive logits bias of one (query block, key block) tile from the `token_context`
        of its queries and keys, broadcastable to B x H x T x S (added with `bias`)."""
        return None

    def transform_logits(self, scores_BxHxTxS, bias_BxHxTxS, q_pos_BxT, k_pos_BxS) -> jax.Array | None:
        """The logits of one tile from its scores (q k^T / sqrt(K), times `logit_scale`) and its
        additive bias (`bias` plus `context_bias`; None where there is none), elementwise per
        (query, key) pair; None (the default): scores + bias. Only where `transforms_logits`."""
        return None

    def carried_bias(self, q_BxTxHxK, k_BxSxHxK, q_pos_BxT, k_pos_BxS, carry_BxHxT):
        """For a `needs_full_rows` bias, blockwise: the bias of one key tile given a per-query carry
        from the key tiles after it (zero before the last), and the carry extended by this tile:
        (bias, carry). Key tiles are visited right to left. Only where `carries_bias` is set."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no carried_bias")

    def check_length(self, length: int) -> None:
        """Raise `LengthError` if positions 0 .. length-1 cannot be encoded."""

    def sample_positions(self, positions_BxT: jax.Array, key: jax.Array, training: bool = True) -> jax.Array:
        """The positions to run with, where `samples_positions` is set: in training (the decoder
        calls it when it has a dropout key) and, with `training=False`, in evaluation (per window,
        with a key derived from the run's seed and the window's index). The identity by default;
        `randomized` draws a sorted random subset of a longer range."""
        return positions_BxT


_REGISTRY: dict[str, type[Scheme]] = {}


def register(name: str):
    """Class decorator: `@register("alibi")`."""
    def wrap(cls: type[Scheme]) -> type[Scheme]:
        if name in _REGISTRY:
            raise ValueError(f"positional scheme {name!r} is registered twice")
        if name in LEGACY_NAMES:
            raise ValueError(f"positional scheme name {name!r} is the old name of {LEGACY_NAMES[name]!r} "
                             f"(LEGACY_NAMES): saved runs would resolve it to that one")
        if not dataclasses.is_dataclass(cls.Options):
            raise TypeError(f"{cls.__name__}.Options must be a frozen dataclass")
        domains.domains_of(cls.Options)  # its DOMAINS name its fields (posenc/domains.py)
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return wrap


# Old name -> registered name, for schemes that were renamed: a run saved under the old name (its
# config.json has `"posenc": {"name": "recurrent", "recurrent": {...options}}`) still loads, builds
# and evaluates. `names()` lists only registered names; `canonical_config` rewrites a saved block.
LEGACY_NAMES: dict[str, str] = {
    "recurrent": "floater",  # FLOATER (Liu et al. 2020) was registered as "recurrent" until it got its paper's name
}
_warned_legacy: set[str] = set()


def canonical_name(name: str) -> str:
    """The registered name of `name`: itself, or what a legacy name (LEGACY_NAMES) now is."""
    return LEGACY_NAMES.get(name, name)


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


def names() -> list[str]:
    """Every registered scheme, sorted (legacy names are not listed)."""
    return sorted(_REGISTRY)


def get(name: str) -> type[Scheme]:
    """The scheme class registered as `name` (or, with a one-time deprecation log, as what the legacy
    name `name` now is); unknown names raise a ValueError listing the valid ones."""
    if name in LEGACY_NAMES:
        if name not in _warned_legacy:
            _warned_legacy.add(name)
            log.warning("positional scheme %r is now called %r; the old name still works", name, LEGACY_NAMES[name])
        name = LEGACY_NAMES[name]
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
                f"unknown positional scheme {name!r}; registered schemes: {', '.join(names())}") from None


def default_config(name: str = "alibi") -> ml_collections.ConfigDict:
    """`posenc` config block: the chosen `name` plus one sub-block of defaults per registered scheme,
    so that `--config.posenc.name=rope --config.posenc.rope.base=500000` works from any config.
    A legacy name gives the block as a run saved under it has it: that name and its option block
    (in place of the registered name's), so `cfg[name]` holds its defaults."""
    get(name)
    cfg = ml_collections.ConfigDict({"name": name})
    for scheme_name, cls in sorted(_REGISTRY.items()):
        fields = {f.name: getattr(cls.Options(), f.name) for f in dataclasses.fields(cls.Options)}
        if fields:
            cfg[name if canonical_name(name) == scheme_name else scheme_name] = fields
    return cfg


def used_schemes(posenc_cfg: Any) -> list[str]:
    """The schemes a `posenc` block runs: its `name` and, for wrappers, what they wrap (their `base`),
    outermost first. Options of any other scheme have no effect on the run. Names come as the block
    spells them (a legacy name stays legacy), so `posenc_cfg[name]` is each one's option block."""
    used = [posenc_cfg["name"]]
    while getattr(get(used[-1]), "wraps_scheme", False):
        block = posenc_cfg.get(used[-1], None) or {}
        inner = block.get("base", None) or get(used[-1]).Options().base
        if inner in used:
            break
        used.append(inner)
    return used


def wrapper_names() -> list[str]:
    """The registered schemes that wrap another one (their option `base`): logn, randomized, ssmax, pose, dape."""
    return [name for name in names() if getattr(_REGISTRY[name], "wraps_scheme", False)]


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
        get(wrapper)  # an unknown name: the registry's error
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
    if canonical_name(scheme) not in _REGISTRY:
        raise ValueError(f"{dotted}: unknown positional scheme {scheme!r}; registered schemes: {', '.join(names())}")
    spelled = [u for u in used if u != scheme and canonical_name(u) == canonical_name(scheme)]
    if spelled:  # old and new name of one scheme: its options are read from the block the run names
        raise ValueError(f"{dotted}: this run names the scheme {spelled[0]!r} ({scheme!r} and {spelled[0]!r} are "
                         f"one scheme, renamed); set posenc.{spelled[0]}.{'.'.join(parts[2:])} instead, or name "
                         f"it {canonical_name(scheme)!r} throughout")
    if scheme not in used:
        raise ValueError(f"{dotted} has no effect: this run uses {' -> '.join(used)}, not {scheme}; "
                         f"drop the option (or set posenc.name={scheme})")
    valid = sorted(f.name for f in dataclasses.fields(get(scheme).Options))
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
        domains.check(get(name).Options, given, f"posenc.{name}")


def build(posenc_cfg: Any, dims: ModelDims, *, rngs: nnx.Rngs) -> Scheme:
    """Instantiate the scheme named in a `posenc` config block (ConfigDict or plain dict)."""
    name = posenc_cfg["name"]
    cls = get(name)
    given = dict(posenc_cfg.get(name, None) or {})
    valid = {f.name for f in dataclasses.fields(cls.Options)}
    unknown = set(given) - valid
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for positional scheme {name!r}; "
                                          f"valid options: {sorted(valid) or 'none'}")
    domains.check(cls.Options, given, f"posenc.{name}")
    if getattr(cls, "wraps_scheme", False):  # wrappers build their inner scheme from the same block
        return cls(cls.Options(**given), dims, rngs=rngs, posenc_cfg=posenc_cfg)
    return cls(cls.Options(**given), dims, rngs=rngs)
