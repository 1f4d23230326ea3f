"""A GGUF file (llama.cpp's and Ollama's checkpoint format) as what hf.py reads from a Hugging Face
folder, so that one loader serves both: its metadata as a config.json dict (hf_mapping.py turns that
into a ModelConfig and `rope` options), its tensors by their HF names (`get(name, shape)`, as
hf.Tensors), and its tokenizer (gguf_tokenizer.py).

The file is read with the `gguf` package (llama.cpp's reader and de-quantizer): every tensor type it
de-quantizes, one tensor at a time when asked for, its bytes read from the file (not kept mapped)
and de-quantized a few rows at a time, so that loading holds little beside the float32 parameters
(SmolLM2-135M: 1.3x them at the peak, benchmarks/hf_load_memory.py --gguf). What differs between
architectures (which are read, their own metadata keys, how llama.cpp changed their tensors: Llama's
query and key rows reordered so that rotary pairs are adjacent, Gemma's norm weights stored as 1 + w)
is their row's `gguf` in architectures.py; `get` undoes those changes. Every failure is an HFError of
one line naming the file.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import re
from pathlib import Path
from typing import Any

import gguf
import jax
import numpy as np
from tokenizers import Tokenizer

from models.formats import HFError
from models.formats.architectures import GGUFForm, by_gguf_name
from models.formats.gguf_tokenizer import TokenizerMetadataError, from_metadata

NORM_WEIGHT = re.compile(r"(norm|layernorm)\.weight$")  # HF's names of the tensors a norm offset applies to
ROTARY_ROWS = re.compile(r"self_attn\.[qk]_proj\.")  # ... and of those whose rows llama.cpp may reorder
ROPE_SCALINGS = ("none", "linear", "yarn")
ROWS_AT_ONCE = 256  # rows of a tensor de-quantized together


def _dequantizable(qtype: gguf.GGMLQuantizationType) -> bool:
    """Whether the gguf package de-quantizes `qtype` (asked with one block of zeros)."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


TENSOR_TYPES = tuple(q for q in gguf.GGMLQuantizationType if q in gguf.GGML_QUANT_SIZES and _dequantizable(q))


def is_gguf(path: str | Path) -> bool:
    """Whether `path` is for this module: a local file (GGUF or not), or a name ending in .gguf
    (a missing file is refused here, not looked for on the hub). A folder or hub id is HF's."""
    local = Path(path).expanduser()
    return local.is_file() or (local.suffix.lower() == ".gguf" and not local.is_dir())


def _f32(x: float) -> float:
    """A float32 from the metadata as its shortest decimal (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _read(path: Path) -> gguf.GGUFReader:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise HFError(f"{path}: cannot read the GGUF file ({e.strerror})") from None
    if magic != b"GGUF":
        raise HFError(f"{path}: not a GGUF file (it begins with {magic!r}, not b'GGUF') nor a folder with a "
                      f"Hugging Face checkpoint")
    try:
        return gguf.GGUFReader(path)
    except ValueError as e:
        unknown = re.search(r"(\d+)\)? is not a valid GGMLQuantizationType", str(e))
        if unknown:
            raise HFError(f"{path}: a tensor has type number {unknown.group(1)}, which the gguf package does not "
                          f"know; supported: {', '.join(t.name for t in TENSOR_TYPES)}") from None
        raise HFError(f"{path}: truncated or corrupt GGUF file ({_one_line(e)})") from None
    except (IndexError, KeyError, OverflowError, UnicodeDecodeError, TypeError) as e:
        raise HFError(f"{path}: truncated or corrupt GGUF file ({_one_line(e)})") from None


def _parse(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The file's metadata (key -> value) and its tensors' descriptions by name; the reader, and the
    many small arrays it makes of the metadata, are dropped on return."""
    reader = _read(path)
    try:
        meta = {name: field.contents() for name, field in reader.fields.items()}
    except (UnicodeDecodeError, IndexError, ValueError) as e:
        raise HFError(f"{path}: corrupt GGUF metadata ({_one_line(e)})") from None
    return meta, {t.name: t for t in reader.tensors}


def _return_freed_memory() -> None:
    """Hand the reader's freed metadata back to the system (glibc keeps much of it otherwise: tens
    of MB for a 49k-token vocabulary, held through the whole load). Nothing off glibc."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class GGUFCheckpoint:
    """An opened GGUF checkpoint: `config` (config.json's form), `tokenizer`, and `get(name, shape)`,
    the tensor of HF name `name` as a float32 array (HFError where missing or of another shape).
    A context manager like hf.Tensors, so that models/formats/hf.py reads either the same way."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.meta, self._tensors = _parse(self.path)
        self.arch = self.meta.get("general.architecture")
        self.row = by_gguf_name(self.arch, str(self.path))
        self.config = self._config()
        self._names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[self.arch.upper()], self.config["num_hidden_layers"])
        try:
            self.tokenizer: Tokenizer = from_metadata(self.meta)
        except TokenizerMetadataError as e:
            raise HFError(f"{self.path}: {e}") from None
        # the vocabulary lives on in the tokenizer; the metadata's lists of it go
        self.meta = {k: v for k, v in self.meta.items() if not isinstance(v, list) or len(v) < 1024}
        _return_freed_memory()

    def __enter__(self) -> "GGUFCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self._tensors = {}  # the memory map goes with the last reference to its tensors

    def _key(self, name: str, default: Any = None) -> Any:
        return self.meta.get(f"{self.arch}.{name}", default)

    def _need(self, name: str) -> Any:
        value = self._key(name)
        if value is None:
            raise HFError(f"{self.path}: metadata {self.arch}.{name} is missing")
        return value

    def _config(self) -> dict[str, Any]:
        """config.json as HF writes it for this architecture, from the metadata."""
        if "token_embd.weight" not in self._tensors:
            raise HFError(f"{self.path}: tensor token_embd.weight is missing")
        d_model, heads = int(self._need("embedding_length")), int(self._need("attention.head_count"))
        head_dim = int(self._key("attention.key_length", d_model // heads))
        if int(self._key("attention.value_length", head_dim)) != head_dim:
            raise HFError(f"{self.path}: attention.value_length differs from attention.key_length; not supported")
        if int(self._key("rope.dimension_count", head_dim)) != head_dim:
            raise HFError(f"{self.path}: rotary embedding on {self._key('rope.dimension_count')} of {head_dim} "
                          f"features per head (rope.dimension_count) is not supported")
        context = int(self._need("context_length"))
        config = {
            "architectures": [self.row.hf_name], "model_type": self.arch,
            "vocab_size": int(self._tensors["token_embd.weight"].shape[1]), "hidden_size": d_model,
            "intermediate_size": int(self._need("feed_forward_length")),
            "num_hidden_layers": int(self._need("block_count")), "num_attention_heads": heads,
            "num_key_value_heads": int(self._key("attention.head_count_kv", heads)), "head_dim": head_dim,
            "hidden_act": self.row.activation, "max_position_embeddings": context,
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "attention_bias": "blk.0.attn_q.bias" in self._tensors, "mlp_bias": False,
            "rope_parameters": {**self._rope_parameters(context), "rope_theta": _f32(self._key("rope.freq_base", 1e4))},
        }
        for which, key in (("bos", "bos"), ("eos", "eos"), ("padding", "pad"), ("unknown", "unk")):  # as config.json
            token = self.meta.get(f"tokenizer.ggml.{which}_token_id")
            if token is not None:
                config[f"{key}_token_id"] = int(token)
        form: GGUFForm = self.row.gguf
        for key in form.keys:  # the architecture's own keys
            value = self._key(key.suffix, key.default) if key.default is not None else self._need(key.suffix)
            config[key.config_key] = _f32(value) if isinstance(value, (float, np.floating)) else value
        return {**config, **(form.derived(config) if form.derived else {})}

    def _rope_parameters(self, context: int) -> dict[str, Any]:
        """HF's rope dict of `{arch}.rope.scaling.*` (or the older rope.scale_linear); Llama 3's
        per-frequency divisors (tensor rope_freqs.weight) as LongRoPE's factor lists with factor 1
        (the same frequencies, attention factor 1, at every length)."""
        kind = self._key("rope.scaling.type") or ("linear" if self._key("rope.scale_linear") else "none")
        factor = float(self._key("rope.scaling.factor") or self._key("rope.scale_linear") or 1.0)
        if kind not in ROPE_SCALINGS:
            raise HFError(f"{self.path}: {self.arch}.rope.scaling.type {kind!r} is not supported; supported: "
                          f"{', '.join(ROPE_SCALINGS)}")
        if "rope_freqs.weight" in self._tensors:
            if kind != "none" and factor != 1.0:
                raise HFError(f"{self.path}: rope_freqs.weight together with {self.arch}.rope.scaling.type {kind!r}"
                              f" is not supported")
            freqs = [float(f) for f in np.asarray(self._array("rope_freqs.weight")).ravel()]
            return {"rope_type": "longrope", "short_factor": freqs, "long_factor": freqs, "factor": 1.0,
                    "original_max_position_embeddings": context}
        if kind == "none" or factor == 1.0:
            return {"rope_type": "default"}
        if kind == "linear":
            return {"rope_type": "linear", "factor": factor}
        params = {"rope_type": "yarn", "factor": factor,
                  "original_max_position_embeddings": int(self._key("rope.scaling.original_context_length", context))}
        for ours, theirs in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if self._key(f"rope.scaling.{theirs}") is not None:
                params[ours] = float(self._key(f"rope.scaling.{theirs}"))
        attn = self._key("rope.scaling.yarn_attn_factor", self._key("rope.scaling.attn_factor"))
        if attn is not None and not math.isclose(attn, 1.0):  # llama.cpp scales YaRN's own 0.1 ln(s) + 1 by it
            params["attention_factor"] = float(attn) * (0.1 * math.log(factor) + 1.0)
        return params

    def _array(self, name: str) -> np.ndarray:
        """The tensor `name` (GGUF's name) de-quantized to float32, rows x columns as HF holds it."""
        t = self._tensors[name]
        if t.tensor_type not in TENSOR_TYPES:
            raise HFError(f"{self.path}: tensor {name} has type {t.tensor_type.name}, which the gguf package "
                          f"cannot de-quantize; supported: {', '.join(q.name for q in TENSOR_TYPES)}")
        raw = np.empty(t.n_bytes, np.uint8)
        with open(self.path, "rb") as f:  # read, not mapped: a mapped file's pages would stay resident
            f.seek(t.data_offset)
            if f.readinto(raw) != t.n_bytes:
                raise HFError(f"{self.path}: tensor {name} cannot be read, truncated or corrupt file")
        data = raw.view(t.data.dtype).reshape(t.data.shape)  # as gguf's reader would map it
        shape = tuple(reversed(t.shape.tolist()))
        if data.ndim == 1:
            return gguf.quants.dequantize(data, t.tensor_type).reshape(shape)
        out = np.empty((data.shape[0], math.prod(shape) // data.shape[0]), np.float32)
        for start in range(0, len(out), ROWS_AT_ONCE):  # bounded temporaries (gguf holds a whole copy)
            rows = data[start:start + ROWS_AT_ONCE]
            out[start:start + len(rows)] = gguf.quants.dequantize(rows, t.tensor_type).reshape(len(rows), -1)
        return out.reshape(shape)

    def get(self, name: str, shape: tuple[int, ...]) -> jax.Array:
        """The tensor of HF name `name` (gguf's name table maps it), float32 in HF's layout."""
        ours = self._names.get_name(name, try_suffixes=(".weight", ".bias"))
        if ours is None or ours not in self._tensors:
            raise HFError(f"{self.path}: tensor {ours or name} (HF's {name}) is missing from the checkpoint")
        array = self._array(ours)
        if array.shape != tuple(shape):
            raise HFError(f"{self.path}: tensor {ours} has shape {array.shape}, expected {tuple(shape)} "
                          f"(from its metadata)")
        form: GGUFForm = self.row.gguf
        if form.rotary_rows_interleaved and ROTARY_ROWS.search(name):
            heads = self.config["num_attention_heads" if ".q_proj." in name else "num_key_value_heads"]
            array = unpermute(array, heads)
        if form.norm_offset and NORM_WEIGHT.search(name):
            array = array - np.float32(form.norm_offset)  # llama.cpp stores Gemma's 1 + weight; HF's holds weight
        # device_put, not jnp.asarray: the latter holds a second host copy of the tensor until it is freed
        return jax.device_put(array).block_until_ready()  # copied before the next tensor is de-quantized


def permute(x: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of a Llama query or key weight's rows (or bias): within each head, the two
    halves interleaved, so that rotary pairs are adjacent."""
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def unpermute(x: np.ndarray, heads: int) -> np.ndarray:
    """HF's order back from llama.cpp's (the inverse of `permute`)."""
    return x.reshape(heads, x.shape[0] // heads // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
