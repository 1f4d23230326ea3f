"""A DecoderLM as a GGUF file (llama.cpp's format), the inverse of gguf.py, written as llama.cpp's
converter (convert_hf_to_gguf.py) writes the architectures whose row in architectures.py has a GGUF
form (Llama, Qwen2): nothing here names an architecture.

`prepare(model, rope_parameters, tokenizer_meta, tensor_type)` checks everything and plans the file
(nothing is written; `Prepared.nbytes` is its size, for a disk-space check); `Prepared.write(path)`
writes it with the gguf package's GGUFWriter, one tensor at a time. The file holds:
  metadata   general.* (architecture, name, file type); `{arch}.*`: context length, embedding, feed-
             forward and block counts, head counts (and key / value length where the heads are not
             d / H wide), rope base and dimension count, the row's own keys (`GGUFForm.keys`: norm
             epsilon, ...) and the rope scaling (`rope_metadata`); the tokenizer's (given, from
             gguf_tokenizer_writer.py)
  tensors    HF's tensors (hf.py: hf_tensors) under gguf's names for the architecture, Llama's query
             and key rows in llama.cpp's order (`GGUFForm.rotary_rows_interleaved`), norms offset
             (`norm_offset`); 1-d tensors float32, 2-d ones in the type asked for (q8_0 through
             gguf's quantizer; a row not a multiple of its 32-wide block in f16, as the converter
             does); tied embeddings stay tied (no output.weight), as the model has them
Rope scaling (HF's rope dict, which experiment/convert/hf.py derives from a run's options and checks):
  linear  rope.scaling.type linear, factor
  yarn    rope.scaling.type yarn, factor, original_context_length, yarn_beta_fast / slow; attn_factor
          where the attention factor is not YaRN's own 0.1 ln s + 1 (llama.cpp multiplies that by it)
  llama3  tensor rope_freqs.weight, each frequency's divisor (as the converter computes it), where
          the architecture's llama.cpp graph reads one (`GGUFForm.rope_freqs`)
  longrope  with factor 1 and the same short and long factors (a GGUF file's rope_freqs read back):
          rope_freqs.weight
Anything else (dynamic NTK, LongRoPE proper, YaRN betas llama.cpp does not read) is an HFError of one
line. A model scaled with YaRN or Llama 3 gets original length x factor as its context length (what
llama.cpp then runs at by default); it is otherwise the length the model was trained at.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np

from models.formats import HFError
from models.formats.architectures import Architecture
from models.formats.gguf import NORM_WEIGHT, ROTARY_ROWS, permute
from models.formats.hf import hf_tensors
from models.formats.hf_mapping import architecture_of

Q = gguf.GGMLQuantizationType
F = gguf.LlamaFileType
TENSOR_TYPES = {"f32": (Q.F32, F.ALL_F32), "f16": (Q.F16, F.MOSTLY_F16), "bf16": (Q.BF16, F.MOSTLY_BF16),
                "q8_0": (Q.Q8_0, F.MOSTLY_Q8_0)}
LLAMA_CPP_YARN_BETAS = (32.0, 1.0)  # what llama.cpp's Llama and Qwen2 use (they read no yarn_beta_* key)


def _same(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-6)


def llama3_divisors(rope: dict, head_dim: int) -> np.ndarray:
    """Llama 3's scaling as a divisor per frequency (llama.cpp divides each by it), as the converter
    computes them: 1 for short wavelengths, the factor for long ones, a smooth blend between."""
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    original = float(rope["original_max_position_embeddings"])
    freqs = 1.0 / float(rope["rope_theta"]) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelength = 2 * math.pi / freqs
    smooth = (original / wavelength - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    divisors = np.where(wavelength < original / high, 1.0, np.where(wavelength > original / low, factor, blended))
    return divisors.astype(np.float32)


def rope_metadata(rope: dict, form_name: str, rope_freqs: bool, head_dim: int,
                  trained: int) -> tuple[dict[str, Any], np.ndarray | None, int]:
    """(`{arch}.rope.scaling.*` keys without the prefix, the rope_freqs tensor or None, the context
    length) of HF's rope dict `rope` (module docstring); HFError for what GGUF cannot hold."""
    kind, factor = rope.get("rope_type", "default"), rope.get("factor")
    if kind == "default":
        return {}, None, trained
    if kind == "linear":
        return {"rope.scaling.type": "linear", "rope.scaling.factor": float(factor)}, None, trained
    if kind == "yarn":
        betas = (float(rope.get("beta_fast", 32.0)), float(rope.get("beta_slow", 1.0)))
        if not all(_same(a, b) for a, b in zip(betas, LLAMA_CPP_YARN_BETAS)):
            raise HFError(f"YaRN with beta_fast={betas[0]:g}, beta_slow={betas[1]:g} cannot be expressed in GGUF: "
                          f"llama.cpp's {form_name} reads no yarn_beta_* key and uses 32 and 1; export with those")
        original = int(rope["original_max_position_embeddings"])
        keys = {"rope.scaling.type": "yarn", "rope.scaling.factor": float(factor),
                "rope.scaling.original_context_length": original, "rope.scaling.yarn_beta_fast": betas[0],
                "rope.scaling.yarn_beta_slow": betas[1]}
        own = 0.1 * math.log(float(factor)) + 1.0
        attention = rope.get("attention_factor")
        if attention is not None and not _same(attention, own):
            keys["rope.scaling.attn_factor"] = float(attention) / own
        return keys, None, max(trained, round(original * float(factor)))
    divisors = None
    if kind == "llama3":
        divisors = llama3_divisors(rope, head_dim)
        length = max(trained, round(int(rope["original_max_position_embeddings"]) * float(factor)))
    elif kind == "longrope" and _same(factor or 1.0, 1.0) and list(rope["short_factor"]) == list(
            rope["long_factor"]) and rope.get("attention_factor") in (None, 1.0):
        divisors, length = np.asarray(rope["long_factor"], np.float32), trained
    if divisors is None:
        raise HFError(f"rope scaling {kind!r} cannot be expressed in GGUF metadata (llama.cpp has linear, yarn and "
                      f"per-frequency divisors); export the run without it")
    if not rope_freqs:
        raise HFError(f"rope scaling {kind!r} needs per-frequency divisors (rope_freqs), which llama.cpp's "
                      f"{form_name} does not read; export the run without it")
    return {}, divisors, length


@dataclasses.dataclass
class Planned:
    name: str                              # GGUF's tensor name
    shape: tuple[int, ...]                 # rows x columns, as HF holds it (GGUF lists the dimensions reversed)
    qtype: Q
    array: Callable[[], np.ndarray]        # its float32 values, as the file holds them (before typing)

    @property
    def nbytes(self) -> int:
        return int(math.prod(gguf.quant_shape_to_byte_shape(self.shape, self.qtype)))


def _planned(name: str, shape: tuple[int, ...], wanted: Q, array: Callable[[], np.ndarray]) -> Planned:
    """1-d tensors in float32; a row that is no whole number of the type's blocks in f16 (the converter's rule)."""
    qtype = Q.F32 if len(shape) == 1 else wanted
    if shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        qtype = Q.F16
    return Planned(name, tuple(shape), qtype, array)


def _typed(array: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.F32:
        return np.ascontiguousarray(array, np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(array, np.float16)
    return gguf.quants.quantize(np.ascontiguousarray(array, np.float32), qtype)


class _Writer(gguf.GGUFWriter):
    """gguf's writer, except that an empty array is written (gguf's `add_array` drops it without a word
    and its packer refuses it): a byte-level tokenizer has no merges, and llama.cpp's loader, like
    ours, requires the `tokenizer.ggml.merges` key all the same."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type or gguf.GGUFValueType.STRING) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _add(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    """A metadata value typed as llama.cpp's converter types it; an empty list an empty array of strings."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, (int, np.integer)):
        writer.add_uint32(key, int(value))
    elif isinstance(value, (float, np.floating)):
        writer.add_float32(key, float(value))
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif len(value) == 0:
        writer.add_key_value(key, [], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
    else:
        writer.add_array(key, list(value))


@dataclasses.dataclass
class Prepared:
    """A checked plan of the file: its architecture, metadata (full keys) and tensors."""
    arch: str
    metadata: dict[str, Any]
    tensors: list[Planned]

    @property
    def nbytes(self) -> int:
        """An upper bound of the file's size: the tensors with their alignment, and room for the metadata."""
        meta = sum(len(str(v)) + 64 for v in self.metadata.values()) + sum(
            16 * len(v) for v in self.metadata.values() if isinstance(v, list))
        return meta + sum(t.nbytes + gguf.GGUF_DEFAULT_ALIGNMENT for t in self.tensors) + 65536

    def write(self, path: str | Path, progress: Callable[[int, int], None] | None = None) -> None:
        """Write the file at `path`, tensors one at a time; `progress(done, total)` after each."""
        logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)  # its lines of what it writes: ours say it
        writer = _Writer(str(path), self.arch)
        try:
            for key, value in self.metadata.items():
                _add(writer, key, value)
            for t in self.tensors:
                writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for done, t in enumerate(self.tensors, 1):
                writer.write_tensor_data(_typed(t.array(), t.qtype))
                if progress:
                    progress(done, len(self.tensors))
        finally:
            writer.close()


def _shape_metadata(config: dict, head_dim: int) -> dict[str, Any]:
    """The `{arch}.*` keys every architecture has, from config.json's dict (hf.py's export form)."""
    d, heads = config["hidden_size"], config["num_attention_heads"]
    keys = {"vocab_size": config["vocab_size"], "embedding_length": d,
            "feed_forward_length": config["intermediate_size"],
            "block_count": config["num_hidden_layers"], "attention.head_count": heads,
            "attention.head_count_kv": config["num_key_value_heads"], "rope.dimension_count": head_dim,
            "rope.freq_base": float(config["rope_parameters"]["rope_theta"])}
    if head_dim * heads != d:
        keys.update({"attention.key_length": head_dim, "attention.value_length": head_dim})
    return keys


def prepare(model, rope_parameters: dict, tokenizer_meta: dict[str, Any], tensor_type: str = "f16",
            name: str = "") -> Prepared:
    """The checked plan of `model`'s GGUF file (module docstring): `rope_parameters`, HF's rope dict
    of its scaling; `tokenizer_meta`, its `tokenizer.*` keys; `tensor_type`, one of TENSOR_TYPES;
    `name`: general.name. HFError (one line) for what GGUF or llama.cpp cannot hold."""
    if tensor_type not in TENSOR_TYPES:
        raise HFError(f"tensor type {tensor_type!r} is not written; supported: {', '.join(TENSOR_TYPES)}")
    wanted, file_type = TENSOR_TYPES[tensor_type]
    row: Architecture = architecture_of(model.cfg)
    form = row.gguf
    if form is None:
        raise HFError(f"a {row.hf_name} model has no GGUF form here (architectures.py: its row has none)")
    config, tensors = hf_tensors(model, rope_parameters)
    if config["rope_parameters"].get("partial_rotary_factor", 1.0) != 1.0:
        raise HFError(f"rotary embedding on part of each head (rope.fraction "
                      f"{config['rope_parameters']['partial_rotary_factor']}) is not written: llama.cpp's "
                      f"{form.name} rotates whole heads")
    head_dim = config["head_dim"]
    scaling, divisors, context = rope_metadata(config["rope_parameters"], form.name, form.rope_freqs, head_dim,
                                               config["max_position_embeddings"])
    own = {key.suffix: config[key.config_key] for key in form.keys}
    arch_keys = {"context_length": context, **_shape_metadata(config, head_dim), **own, **scaling}
    metadata = {"general.type": "model", **({"general.name": name} if name else {}),
                "general.file_type": int(file_type),
                "general.quantization_version": gguf.GGML_QUANT_VERSION,
                **{f"{form.name}.{k}": v for k, v in arch_keys.items()}, **tokenizer_meta}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[form.name.upper()], config["num_hidden_layers"])
    planned = [_planned("rope_freqs.weight", divisors.shape, Q.F32, lambda: divisors)] if divisors is not None else []
    for hf_name in list(tensors):
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise HFError(f"tensor {hf_name} has no GGUF name for architecture {form.name} (gguf's table)")
        planned.append(_planned(gguf_name, tuple(tensors[hf_name].shape), wanted,
                                _as_stored(tensors, hf_name, form, config)))
    return Prepared(form.name, metadata, planned)


def _as_stored(tensors: dict, hf_name: str, form, config: dict) -> Callable[[], np.ndarray]:
    """The tensor as the file holds it, taken out of `tensors` when asked for (held once at a time)."""
    def array() -> np.ndarray:
        x = np.asarray(tensors.pop(hf_name), np.float32)
        if form.rotary_rows_interleaved and ROTARY_ROWS.search(hf_name):
            x = permute(x, config["num_attention_heads" if ".q_proj." in hf_name else "num_key_value_heads"])
        if form.norm_offset and NORM_WEIGHT.search(hf_name):
            x = x + np.float32(form.norm_offset)
        return x
    return array
