"""The experiment config, typed: one section per concern, each default written once, here.

    seed                  int
    data   DataConfig     where the text comes from and how it becomes tokens
    model  ModelConfig    the decoder (models/config.py; its defaults live there)
    posenc                the positional scheme: `name` and one options block per scheme used
                          (typed by the registry, posenc/: each scheme's Options dataclass)
    train  TrainConfig    the update, the optimizer and its schedule, logging and checkpoints
    mesh   MeshConfig     how devices share the work
    eval   EvalConfig     what `train.py`, `sweep.py` and `eval_extrapolate.py` evaluate

Config files (configs/*.py) start from `defaults()` and set what differs; `typed()` turns a
config (ml_collections.ConfigDict, dict or Config) into a `Config`, refusing unknown keys with the
valid ones. A run saved before an option existed is read with the behaviour it was trained with
(`LEGACY_OPTION_DEFAULTS`), and `config_differences` says what a resumed run may not change.

What each option may hold is declared next to it: `DOMAINS` in each section below, in
models/config.py's ModelConfig and in each positional scheme's `Options` (posenc/domains.py says
how to declare one). `check_domains` checks them all, once, in `resolve` (so before any data is
read or anything is written) and wherever a config is read back (`load_config`) or changed at
evaluation. A value from a config file, a --config flag, --grid, --set or config.json gets the
same error: the option, what is valid, a valid value.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
from typing import Any

import ml_collections

from corpora.sources import SOURCES
from corpora.splits import SPLIT_ALIASES
from models.config import ModelConfig
from posenc import domains, registry
from posenc.domains import at_least, between, each, one_of, positive, satisfies, unit_interval


class ConfigError(ValueError):
    """The config or run directory is inconsistent; the message says what to change."""


TOKENIZERS = ("byte", "word", "bpe", "pretrained")
OPTIMIZERS = ("adamw", "nag")
DROPOUT_RNGS = ("threefry", "rbg", "unsafe_rbg")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str = "builtin"         # builtin | local | hf (corpora/sources.py)
    name: str = "python_docs"       # builtin corpus or HF dataset name
    path: str = ""                  # local folder (source=local, or hf saved to disk)
    hf_config: str = ""             # HF dataset config, e.g. wikitext-103-v1
    text_column: str = "text"
    tokenizer: str = "byte"         # byte | word | bpe | pretrained (import_hf.py)
    vocab_size: int = 0             # bpe: the size to learn (0: the tokenizer's default)
    train_split: str = "train"
    passkey_fraction: float = 0.0   # share of training rows that are passkey examples
    passkey_digits: int = 4
    DOMAINS = {"source": one_of(*SOURCES), "tokenizer": one_of(*TOKENIZERS), "vocab_size": at_least(0, note="0 = "
               "the tokenizer's default"), "train_split": one_of(*SPLIT_ALIASES), "passkey_fraction": unit_interval(),
               "passkey_digits": between(1, 18)}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seq_len: int = 64               # L, the training length
    batch_size: int = 32            # sequences per update, global (as papers state it)
    steps: int = 600
    optimizer: str = "adamw"        # adamw | nag
    lr: float = 2e-3
    warmup_steps: int = 100
    warmup_init_lr: float = 0.0
    min_lr_ratio: float = 0.1       # cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.98
    momentum: float = 0.9           # nag
    grad_clip: float = 1.0
    device_batch_tokens: int = 0    # tokens one device computes at once (0: the whole update)
    log_every: int = 50
    checkpoint_every: int = 200
    init_from: str = ""             # start from another run's parameters (experiment/train/init_from.py)
    init_step: int = 0              # ... at this step (0: its newest)
    dropout_rng: str = "threefry"   # the dropout masks' PRNG: threefry | rbg | unsafe_rbg
    DOMAINS = {"seq_len": at_least(1), "batch_size": at_least(1), "steps": at_least(1),
               "optimizer": one_of(*OPTIMIZERS), "lr": positive(), "warmup_steps": at_least(0),
               "warmup_init_lr": at_least(0),
               "min_lr_ratio": unit_interval(), "weight_decay": at_least(0), "b1": unit_interval(hi_open=True),
               "b2": unit_interval(hi_open=True), "momentum": unit_interval(hi_open=True), "grad_clip": positive(),
               "device_batch_tokens": at_least(0, note="0 = the whole update"), "log_every": at_least(1),
               "checkpoint_every": at_least(1), "init_step": at_least(0, note="0 = the newest"),
               "dropout_rng": one_of(*DROPOUT_RNGS)}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    fsdp: int = 1                   # devices that shard parameters and optimizer state (1: replicated)
    DOMAINS = {"fsdp": at_least(1)}


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    lengths: tuple = ()                         # L_valid values; () = length_multipliers x train.seq_len
    length_multipliers: tuple = (1, 2, 4, 8, 16)
    stride: int = 0                             # 0: nonoverlapping; S: sliding window of stride S
    split: str = "valid"
    batch_tokens: int = 16384                   # tokens per evaluation batch
    max_tokens: int = 0                         # score only the first N tokens (0: the whole split)
    overrides: str = ""                         # eval-time options: "posenc.rope.yarn_scale=4,model.attention=blockwise"
    DOMAINS = {"lengths": each(at_least(1)), "length_multipliers": each(positive()), "stride": at_least(0),
               "split": one_of(*SPLIT_ALIASES), "batch_tokens": at_least(1), "max_tokens": at_least(0),
               "overrides": satisfies(lambda v, _: all("=" in item for item in v.split(",") if item.strip()),
                                      "KEY=VALUE items separated by commas", "posenc.rope.yarn_scale=4")}


SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "mesh": MeshConfig, "eval": EvalConfig}


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int
    data: DataConfig
    model: ModelConfig  # vocab_size 0: known once the tokenizer is (`model_for`)
    posenc: ml_collections.ConfigDict
    train: TrainConfig
    mesh: MeshConfig
    eval: EvalConfig

    def model_for(self, vocab_size: int) -> ModelConfig:
        """The model section with the vocabulary size, checked against it."""
        return ModelConfig.from_config(_fields(self.model), vocab_size)

    def to_dict(self) -> dict:
        out = {"seed": self.seed, "posenc": self.posenc.to_dict()}
        out.update({name: _fields(getattr(self, name)) for name in SECTIONS})
        return out

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)


def _keys(cls) -> list[dataclasses.Field]:
    """A section's config keys (the model's vocabulary size comes from the tokenizer, not the config)."""
    return [f for f in dataclasses.fields(cls) if not (cls is ModelConfig and f.name == "vocab_size")]


def _fields(section) -> dict:
    return {f.name: getattr(section, f.name) for f in _keys(type(section))}


def _make(cls, **values):
    """A section from its values (the model section's vocabulary size is set later: 0)."""
    return cls(**({"vocab_size": 0, **values} if cls is ModelConfig else values))


def defaults(scheme: str = "alibi") -> ml_collections.ConfigDict:
    """Every key with its default, as the ConfigDict a config file returns (overridable by flags)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    for name, cls in SECTIONS.items():
        c[name] = _fields(_make(cls))
    c.posenc = registry.default_config(scheme)
    return c


def arg_count(text: str, default: int, *, part: str, spec: str, example: str) -> int:
    """A whole number >= 1 in a config file's argument (`configs/wikitext103.py:alibi,512`): `text`,
    or `default` where it is empty. A ConfigError names the argument, which `part` of it is wrong
    and a valid argument (`example`)."""
    if not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"--config {spec}: {part} must be a whole number >= 1, got {text!r}; e.g. --config {example}")
    return value


def _section(cls, given: dict, where: str):
    valid = {f.name: f for f in _keys(cls)}
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(f'{where}.{k}' for k in unknown)}; valid keys in "
                          f"{where}: {', '.join(sorted(valid))}")
    values = {}
    for key, value in given.items():
        default = valid[key].default
        if isinstance(default, tuple) and not isinstance(value, tuple):
            value = tuple(value) if isinstance(value, (list, tuple)) else tuple(_as_list(value))
        values[key] = value
    return _make(cls, **values)


def typed(config: Any) -> Config:
    """A Config from a ConfigDict / dict / Config; missing keys take their defaults (runs saved by an
    older version), unknown keys are refused."""
    if isinstance(config, Config):
        return config
    if not hasattr(config, "keys"):
        raise ConfigError(f"a config is a mapping of sections (ml_collections.ConfigDict), got "
                          f"{type(config).__name__}; start from experiment.config.defaults(scheme)")
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    not_blocks = [name for name in ("posenc", *SECTIONS) if name in raw and not hasattr(raw[name], "keys")]
    if not_blocks:
        raise ConfigError(f"config section {not_blocks[0]!r} must be a block of keys, got {raw[not_blocks[0]]!r}")
    unknown = sorted(set(raw) - {"seed", "posenc", *SECTIONS})
    if unknown:
        raise ConfigError(f"unknown config section(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(sorted({'seed', 'posenc', *SECTIONS}))}")
    if "posenc" not in raw:
        raise ConfigError("the config has no posenc section; start from experiment.config.defaults(scheme)")
    sections = {name: _section(cls, dict(raw.get(name) or {}), name) for name, cls in SECTIONS.items()}
    # former scheme names -> current; sequence options as tuples (config.json reads them back as lists)
    scheme = ml_collections.ConfigDict(_tuples(registry.canonical_config(dict(raw["posenc"]))))
    return Config(seed=raw.get("seed", 0), posenc=scheme, **sections)


def _tuples(block):
    """A nested dict with every list made a tuple, as the options' defaults are."""
    if isinstance(block, dict):
        return {k: _tuples(v) for k, v in block.items()}
    return tuple(_tuples(v) for v in block) if isinstance(block, (list, tuple)) else block


def check_domains(config: Config) -> None:
    """Every option of `config` has its type and lies in its declared domain (`DOMAINS` of each
    section, of ModelConfig and of each scheme the run uses); a posenc.DomainError names the
    first one that does not, with a valid value."""
    domains.check(_Seed, {"seed": config.seed}, "")
    for name, cls in SECTIONS.items():
        domains.check(cls, _fields(getattr(config, name)), name)
    registry.check_options(config.posenc)  # unknown scheme -> ValueError with the valid names


@dataclasses.dataclass(frozen=True)
class _Seed:
    seed: int = 0
    DOMAINS = {"seed": at_least(0)}


def resolve(config: Any) -> Config:
    """The typed config with derived values filled in (evaluation lengths from multiples of the
    training length), every option checked against its domain (`check_domains`), so that a
    value that would train wrongly or fail deep inside JAX is refused before any work."""
    config = typed(config)
    check_domains(config)
    ev = config.eval
    lengths = ev.lengths or tuple(int(m * config.train.seq_len) for m in ev.length_multipliers)
    return config.replace(eval=dataclasses.replace(ev, lengths=tuple(int(x) for x in _as_list(lengths))))


def set_typed(config, dotted: str, raw, *, option: str = "--set") -> None:
    """config[dotted] = raw on a ConfigDict, converted to the type of the value it replaces (bool from
    1/true/yes, tuples from "a,b"); a missing key is a ValueError listing the valid ones at its level."""
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
        if part not in node:
            raise ValueError(f"{option} {dotted}: no config key {part!r}; valid: {', '.join(sorted(node.keys()))}")
        node = node[part]
    if leaf not in node:
        raise ValueError(f"{option} {dotted}: no option {leaf!r}; valid: {', '.join(sorted(node.keys()))}")
    node[leaf] = converted(node[leaf], raw, f"{option} {dotted}={raw}")


def converted(old, raw, where: str):
    """`raw` (text from a flag) as a value of the type of `old`; a ValueError naming `where` and
    the type wanted otherwise (its domain is checked later, with the whole config)."""
    if old is None or (isinstance(raw, type(old)) and not isinstance(old, bool)):
        return raw
    text = str(raw).strip()
    if isinstance(old, bool):
        if text.lower() not in ("1", "true", "yes", "0", "false", "no"):
            raise ValueError(f"{where}: {text!r} is not true or false (1/true/yes, 0/false/no)")
        return text.lower() in ("1", "true", "yes")
    if isinstance(old, (tuple, list)):  # elements typed like the first default; any numbers if it has none
        return tuple(converted(old[0], v, where) if old else _number(str(v), where, "a number", 1)
                     for v in _as_list(raw))
    if isinstance(old, int):
        number = _number(text, where, "a whole number", old)
        if not isinstance(number, int):
            raise ValueError(f"{where}: {text!r} is not a whole number (e.g. {old!r})")
        return number
    if isinstance(old, float):
        return float(_number(text, where, "a number", old))
    return type(old)(raw)


def _number(text: str, where: str, kind: str, example) -> int | float:
    """An int or float written in `text` (nan and inf too: their domains refuse them by name)."""
    text = text.strip()
    if text.lower() in ("nan", "inf", "+inf", "-inf"):
        return float(text)
    try:
        number = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        number = None
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        raise ValueError(f"{where}: {text!r} is not {kind} (e.g. {example!r})")
    return number


def _as_list(value) -> list:
    if isinstance(value, str):
        return [v for v in value.translate(str.maketrans("", "", "()[]")).split(",") if v.strip()]
    if isinstance(value, (int, float)):
        return [value]
    return list(value)


def save_config(config: Config, path: pathlib.Path) -> None:
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
    if not isinstance(saved, dict):
        raise ConfigError(f"a config is a mapping of sections, found a {type(saved).__name__}")
    if isinstance(saved.get("posenc"), dict):
        saved["posenc"] = registry.canonical_config(saved["posenc"])  # a scheme saved under a former name
    posenc_block = saved.get("posenc")
    if isinstance(posenc_block, dict):
        for scheme, options in LEGACY_OPTION_DEFAULTS.items():
            if isinstance(posenc_block.get(scheme), dict):
                for key, value in options.items():
                    posenc_block[scheme].setdefault(key, value)
    return saved


def load_config(path: pathlib.Path) -> Config:
    return typed(read_saved_config(path))


# Keys that may differ when an existing run is resumed; anything else must match config.json.
RESUMABLE_KEYS = ("train.steps", "train.log_every", "train.checkpoint_every", "eval", "model.attention",
                  "model.attention_block", "model.attention_check",  # the same attention, checked or not
                  "train.device_batch_tokens", "mesh",  # these two: same update
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
