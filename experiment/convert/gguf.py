"""A run's newest checkpoint as a GGUF file (llama.cpp, Ollama, LM Studio): `export_gguf(workdir, out,
overrides, tensor_type, force)`, what `export_hf.py RUN --gguf OUT.gguf [--type f16] [--set ...]` calls.

The model is the one evaluation restores, with `overrides` (eval-time rope options, as --set takes
them: `posenc.rope.yarn_scale=2` exports training-free YaRN x2); its rope options become HF's rope
dict (experiment/convert/hf.py: hf_rope_parameters, which refuses what HF cannot express) and that
the file's rope metadata (models/formats/gguf_writer.py); its tokenizer the tokenizer.ggml.* keys
(models/formats/gguf_tokenizer_writer.py) with the special tokens and chat template import_hf kept
beside the run (special_tokens_map.json, chat_template.jinja). A training-free method that GGUF
metadata cannot express (Self-Extend, DCA, LM-Infinite, ReRoPE, log-n, NTK-aware, dynamic NTK or
YaRN) and a scheme other than RoPE are refused with one line naming them, before anything is loaded.

`out` is a file: one that exists is refused unless `force`. The file is written beside it under a
hidden name and moved into place at the end, so a failed, interrupted or full-disk export leaves
`out` as it was (the device's free space is checked first; a full one names `out` and the size).
"""
from __future__ import annotations

import logging
import os
import pathlib

import posenc
from experiment import config as config_lib
from experiment.convert.hf import hf_rope_parameters, kept_special_tokens
from experiment.convert.read_back import read_back
from experiment.evals.common import apply_overrides, load_checkpoint
from experiment.evals.methods import METHODS
from experiment.store import files
from experiment.store.run import RunDir, RunError
from models.formats import HFError
from models.formats.gguf_tokenizer import TokenizerMetadataError
from models.formats.gguf_tokenizer_writer import tokenizer_metadata
from models.formats.gguf_writer import TENSOR_TYPES, prepare
from models.generation.chat import TEMPLATE_FILE

log = logging.getLogger(__name__)

SPECIAL_TOKENS = {"bos": "bos_token", "unknown": "unk_token", "padding": "pad_token"}  # GGUF's name -> HF's key
GGUF_METHODS = ("direct", "pi", "yarn", "llama3")  # the training-free methods GGUF metadata holds


def _differs(config: dict, dotted: str) -> object | None:
    """The run's value of option `dotted` (posenc.rope.X or model.X; `config` as a dict) where it is
    not the default."""
    ours, theirs = config, config_lib.defaults("rope").to_dict()
    for key in dotted.split("."):
        ours = ours.get(key) if isinstance(ours, dict) else None
        theirs = theirs.get(key) if isinstance(theirs, dict) else None
    return ours if ours is not None and ours != theirs else None


def check_expressible(config) -> None:
    """Refuse (HFError, one line) a run, with its overrides applied, whose positional scheme or
    training-free method has no GGUF form."""
    name = config.posenc.name
    if name != "rope":
        inner = posenc.used_schemes(config.posenc)
        if "rope" in inner:  # a wrapper around RoPE: log-n, randomized positions
            raise HFError(f"posenc.name={name} (around the run's RoPE) cannot be expressed in GGUF metadata: llama.cpp "
                          f"has no such scaling; export without it")
        raise HFError(f"positional scheme {name!r} has no GGUF form: llama.cpp's llama and qwen2 use RoPE; only runs "
                      f"with rope export")
    as_dict = config.to_dict()
    for method, spec in METHODS.items():
        if method in GGUF_METHODS:
            continue
        for dotted in spec.options(2.0, 1024):
            value = _differs(as_dict, dotted)
            if value is not None:
                raise HFError(f"{spec.label} ({dotted}={value}) cannot be expressed in GGUF metadata: llama.cpp reads "
                              f"linear and YaRN scaling and per-frequency divisors only; export without it")


def _special_ids(run: RunDir, tokenizer) -> dict[str, int]:
    """The ids of the special tokens import_hf kept (special_tokens_map.json), by GGUF's names."""
    kept = kept_special_tokens(run)
    ids = {ours: tokenizer.token_to_id(kept[theirs]) for ours, theirs in SPECIAL_TOKENS.items() if theirs in kept}
    return {name: int(index) for name, index in ids.items() if index is not None}


def _claim(out: pathlib.Path, force: bool) -> None:
    if out.is_dir():
        raise RunError(f"--gguf {out} is a folder; give a file name, e.g. --gguf {out / 'model.gguf'}")
    if out.exists() and not force:
        raise RunError(f"--gguf {out} exists; give a new file name, or --force to replace it")
    folder = next(p for p in (out.absolute().parent, *out.absolute().parents) if p.exists())
    if not os.access(folder, os.W_OK):  # (a read-only file system included, for root too)
        raise RunError(f"--gguf {out}: cannot write in {folder} (read-only, or no permission); give a --gguf in a "
                       f"folder you can write")


def export_gguf(workdir: str | pathlib.Path, out: str | pathlib.Path, overrides: dict | None = None,
                tensor_type: str = "f16", force: bool = False) -> pathlib.Path:
    """Write the run's newest checkpoint as the GGUF file `out` (module docstring); returns `out`."""
    out = pathlib.Path(out)
    if tensor_type not in TENSOR_TYPES:
        raise HFError(f"--type {tensor_type} is not written; supported: {', '.join(TENSOR_TYPES)}")
    _claim(out, force)
    run = RunDir(workdir)
    run.require_checkpoint()
    overrides = dict(overrides or {})
    config = run.load_config()
    effective = apply_overrides(config, overrides)
    check_expressible(effective)
    held = [key for key in overrides if not key.startswith("posenc.")]
    if held:
        raise HFError(f"--set {held[0]}={overrides[held[0]]}: a GGUF file holds no {held[0]}; drop it (export takes "
                      f"the rope options, posenc.rope.*)")
    rope = hf_rope_parameters(effective.posenc, int(config.train.seq_len))
    scoring = load_checkpoint(run, config, [], overrides)
    model, tokenizer = scoring.model(), scoring.tokenizer
    hf_tokenizer = tokenizer.hf_tokenizer()
    template = run.path / TEMPLATE_FILE
    try:
        meta = tokenizer_metadata(hf_tokenizer, model.cfg.vocab_size, tokenizer.eos_id, _special_ids(run, hf_tokenizer),
                                  template.read_text() if template.is_file() else None)
    except TokenizerMetadataError as e:
        raise HFError(f"{run.tokenizer_path}: {e}") from None
    prepared = prepare(model, rope, meta, tensor_type, name=run.path.resolve().name)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.writing-{os.getpid()}")
    try:
        with files.space_for(out, prepared.nbytes, staging):
            prepared.write(staging, lambda done, total: done % 50 == 0 and log.info(
                "writing %s: %d of %d tensors", out, done, total))
        read_back(staging, out, model, hf_tokenizer)
        _claim(out, force)
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    log.info("exported %s at step %d to %s (%s, %.1f MB)", run.path, scoring.step, out, tensor_type,
             out.stat().st_size / 1e6)
    return out
