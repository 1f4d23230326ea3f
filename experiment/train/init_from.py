"""Starting a run from another run's parameters (`train.init_from=WORKDIR`, `train.init_step`):
context extension (Chen et al. 2023's position interpolation, Peng et al. 2023's YaRN: a model
trained at L fine-tuned briefly at a longer length), or any fine-tune with new options.

The new run keeps its own training length, schedule and scheme options, and starts with a fresh
optimizer; it takes the base's tokenizer, and its parameters must have exactly the base's names and
shapes (a different model size or a scheme with other parameters is refused, naming them). Where
it came from is recorded in WORKDIR/init_from.json (RunDir.origin) and shown by reports.
"""
from __future__ import annotations

import shutil

import jax
from flax import nnx

from experiment.config import Config, ConfigError
from experiment.model import abstract_model
from experiment.store import checkpoints
from experiment.store.run import RunDir


def base_of(config: Config) -> RunDir | None:
    """The run to start from, checked (it has a checkpoint and the same tokenizer kind)."""
    path = config.train.init_from
    if not path:
        return None
    base = RunDir(path)
    try:
        base.require_checkpoint()
    except ConfigError as e:
        raise ConfigError(f"train.init_from={path}: {e}") from None
    base_config = base.load_config()
    if base_config.data.tokenizer != config.data.tokenizer:
        raise ConfigError(f"train.init_from={path} was trained with data.tokenizer={base_config.data.tokenizer!r}, "
                          f"this run asks for {config.data.tokenizer!r}; set --config.data.tokenizer="
                          f"{base_config.data.tokenizer}")
    return base


def take_tokenizer(base: RunDir, run: RunDir) -> None:
    """A new run starting from `base` uses its tokenizer (token ids must mean the same), and an imported
    base's chat template and special tokens beside it (generation and RULER's chat prompts read them)."""
    if not run.tokenizer_path.exists():
        shutil.copyfile(base.tokenizer_path, run.tokenizer_path)
    from experiment.convert.hf import SPECIAL_TOKENS_FILE
    from models.generation.chat import TEMPLATE_FILE
    for name in (TEMPLATE_FILE, SPECIAL_TOKENS_FILE):
        if (base.path / name).is_file() and not (run.path / name).exists():
            shutil.copyfile(base.path / name, run.path / name)


def _shapes(tree) -> dict[str, tuple]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}


def mismatch(base_params, new_params) -> str:
    """'' when both trees have the same parameter names and shapes, else what differs (a few)."""
    a, b = _shapes(base_params), _shapes(new_params)
    lines = [f"only in the base: {k}" for k in sorted(set(a) - set(b))]
    lines += [f"only in this run: {k}" for k in sorted(set(b) - set(a))]
    lines += [f"{k}: {a[k]} in the base, {b[k]} here" for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    return "; ".join(lines[:5]) + (f"; and {len(lines) - 5} more" if len(lines) > 5 else "")


def load_base_params(config: Config, base: RunDir, params, vocab_size: int):
    """(params restored from the base into the new run's structure and shardings, origin record)."""
    base_config = base.load_config()
    base_params = nnx.split(abstract_model(base_config, vocab_size))[1]
    differs = mismatch(base_params, params)
    if differs:
        raise ConfigError(f"the parameters of train.init_from={base.path} do not fit this model ({differs}); "
                          f"start from a run of the same model size and a scheme with the same parameters")
    step = int(config.train.init_step) or None
    restored, _, meta = checkpoints.restore(base, params, step=step)
    origin = {"workdir": str(base.path.absolute()), "step": int(meta["step"]),
              "scheme": base_config.posenc.name, "train_length": int(base_config.train.seq_len)}
    return restored, origin
