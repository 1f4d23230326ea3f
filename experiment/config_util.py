"""Config helpers shared by the entry points: resolve derived values, save and load config.json."""
from __future__ import annotations

import json
import pathlib

import ml_collections

import posenc


class ConfigError(ValueError):
    """The config or run directory is inconsistent; the message says what to change."""


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Fill derived values (evaluation lengths from multiples of the training length) and check
    the few things that would otherwise fail deep inside JAX."""
    config = ml_collections.ConfigDict(config.to_dict())
    posenc.get(config.posenc.name)  # unknown scheme -> ValueError with the valid names
    if not config.eval.get("lengths"):
        config.eval.lengths = [int(m * config.train.seq_len) for m in config.eval.length_multipliers]
    config.eval.lengths = [int(x) for x in _as_list(config.eval.lengths)]
    for key in ("seq_len", "batch_size", "steps", "log_every", "checkpoint_every"):
        value = config.train.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"train.{key} must be a positive integer, got {value!r}; "
                             f"set --config.train.{key}")
    return config


def set_typed(config, dotted: str, raw, *, option: str = "--set") -> None:
    """config[dotted] = raw, converted to the type of the value it replaces (bool from 1/true/yes,
    tuples from "a,b"); a missing key is a ValueError listing the valid ones at its level."""
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
        if part not in node:
            raise ValueError(f"{option} {dotted}: no config key {part!r}; valid: {', '.join(sorted(node.keys()))}")
        node = node[part]
    if leaf not in node:
        raise ValueError(f"{option} {dotted}: no option {leaf!r}; valid: {', '.join(sorted(node.keys()))}")
    old = node[leaf]
    if isinstance(old, bool):
        value = str(raw).lower() in ("1", "true", "yes")
    elif old is None or isinstance(raw, type(old)):
        value = raw
    elif isinstance(old, (tuple, list)):
        value = tuple(type(old[0])(v) if old else v for v in _as_list(raw))
    else:
        value = type(old)(raw)
    node[leaf] = value


def _as_list(value) -> list:
    if isinstance(value, str):
        return [v for v in value.replace("(", "").replace(")", "").split(",") if v.strip()]
    if isinstance(value, (int, float)):
        return [value]
    return list(value)


def save_config(config: ml_collections.ConfigDict, path: pathlib.Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True, default=list))
    tmp.replace(path)


# Scheme options added after runs were saved without them, with the behaviour those runs had (the
# new default follows the reference code; a saved run keeps what it was trained with).
LEGACY_OPTION_DEFAULTS = {
    "sinusoidal": {"layout": "vaswani"},
    "kerple_log": {"per_layer": True},
    "kerple_power": {"per_layer": True},
    "deberta": {"p2c_index": "paper"},
    "randomized": {"eval_positions": "consecutive"},
}


def read_saved_config(path: pathlib.Path) -> dict:
    """A run's config.json as a dict, options it predates filled in with the behaviour it had."""
    saved = json.loads(pathlib.Path(path).read_text())
    posenc_block = saved.get("posenc")
    if isinstance(posenc_block, dict):
        for scheme, options in LEGACY_OPTION_DEFAULTS.items():
            if isinstance(posenc_block.get(scheme), dict):
                for key, value in options.items():
                    posenc_block[scheme].setdefault(key, value)
    return saved


def load_config(path: pathlib.Path) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(read_saved_config(path))


# Keys that may differ when an existing run is resumed; anything else must match config.json.
RESUMABLE_KEYS = ("train.steps", "train.log_every", "train.checkpoint_every", "eval", "model.attention",
                  "model.attention_block", "train.device_batch_tokens", "mesh",  # these two: same update
                  "model.adaptive_tail_capacity")  # the same loss, scored in fewer or more slots


def config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts, ignoring RESUMABLE_KEYS, the option
    blocks of schemes the run does not use, and keys the old config did not have yet (options added
    by a later version of the code)."""
    diffs = []
    if not prefix and isinstance(old.get("posenc"), dict) and isinstance(new.get("posenc"), dict):
        keep = {"name", new["posenc"].get("name"), old["posenc"].get("name")}
        old = {**old, "posenc": {k: v for k, v in old["posenc"].items() if k in keep}}
        new = {**new, "posenc": {k: v for k, v in new["posenc"].items() if k in keep}}
    for key in sorted(set(old) | set(new)):
        dotted = f"{prefix}{key}"
        if key not in old:
            continue
        if any(dotted == k or dotted.startswith(k + ".") for k in RESUMABLE_KEYS):
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += config_differences(a, b, dotted + ".")
        elif (list(a) if isinstance(a, (list, tuple)) else a) != (list(b) if isinstance(b, (list, tuple)) else b):
            diffs.append(f"{dotted}: {a!r} -> {b!r}")
    return diffs
