"""A `tokenizers.Tokenizer` as a GGUF file's tokenizer metadata (`tokenizer.ggml.*`), the inverse of
gguf_tokenizer.py, for the two forms llama.cpp reads:
  gpt2   byte-level BPE: tokens, token types, merges, and the pre-tokenizer's name (`PRE_NAMES`: the
         names llama.cpp and gguf_tokenizer.py both know); the one whose split gives the tokenizer's
         own ids is written (the same structure first, else the first that encodes `PROBE` alike)
  llama  SentencePiece BPE (byte fallback): tokens, token types (<0xXX> bytes, the unknown token),
         scores (each piece scored by the rank of the first merge that makes it, so that joining the
         highest-scoring pair is the tokenizer's merge order), add_space_prefix
Every token of the model's vocabulary is listed: ids the tokenizer does not use as [PADn], unused (as
llama.cpp's converter pads them). Special added tokens are control tokens, others user-defined. Where
the tokenizer puts BOS first (or EOS last) on its own, add_bos_token (add_eos_token) says so.

The metadata is checked by reading it back (gguf_tokenizer.from_metadata): it must encode `PROBE` to
the tokenizer's ids, else TokenizerMetadataError (one line) says where they part. A word-level or
other model llama.cpp has no form for is refused by name.
"""
from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import Tokenizer

from models.formats.gguf_tokenizer import (BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED,
                                           TokenizerMetadataError, from_metadata)

PRE_NAMES = ("gpt-2", "smollm", "llama-bpe", "qwen2")  # tokenizer.ggml.pre written, in order of preference
PROBE = ("Hello world! It's 2024: 12345.678 and 1,000,000 they'll we've I'M don't\n\nnaïve café cafe\u0301 "
         "Größe 東京 🙂 \ttabs  double  spaces   x=y+1;  (a|b)  <tag>  ...!?  \r\n end  ")
BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def _vocabulary(spec: dict, vocab_size: int) -> tuple[list[str], list[int]]:
    """(tokens, token types) of the model's `vocab_size` ids; ids no token has become [PADn]."""
    tokens: list[str | None] = [None] * vocab_size
    types = [NORMAL] * vocab_size
    entries = [(i, t, None) for t, i in spec["model"]["vocab"].items()]
    entries += [(a["id"], a["content"], bool(a.get("special"))) for a in spec.get("added_tokens") or []]
    for index, token, special in entries:
        if index >= vocab_size:
            raise TokenizerMetadataError(f"the tokenizer's token {token!r} has id {index}, past the model's vocabulary "
                                         f"of {vocab_size}; llama.cpp needs one token per embedding row")
        tokens[index] = token
        if special is not None:
            types[index] = CONTROL if special else USER_DEFINED
    for i, token in enumerate(tokens):
        if token is None:
            tokens[i], types[i] = f"[PAD{i}]", UNUSED
    return tokens, types


def _merges(model: dict) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]


def _ends(tokenizer: Tokenizer) -> tuple[int | None, int | None]:
    """(the id the tokenizer puts first on its own, the id it puts last), None where it adds none."""
    plain = tokenizer.encode("a b", add_special_tokens=False).ids
    full = tokenizer.encode("a b", add_special_tokens=True).ids
    if full == plain or len(full) <= len(plain):
        return None, None
    start = full.index(plain[0]) if plain and plain[0] in full else 0
    head, tail = full[:start], full[start + len(plain):]
    return (head[0] if head else None), (tail[-1] if tail else None)


def _gpt2(spec: dict, tokens: list[str], types: list[int]) -> dict:
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": _merges(spec["model"]), "tokenizer.ggml.add_space_prefix": False}


def _sentencepiece(tokenizer: Tokenizer, spec: dict, tokens: list[str], types: list[int]) -> dict:
    model = spec["model"]
    first_made = {}
    merges = _merges(model)
    for rank, merge in enumerate(merges):
        first_made.setdefault(merge.replace(" ", ""), rank)
    unk = tokenizer.token_to_id(model["unk_token"]) if model.get("unk_token") else None
    scores = [0.0] * len(tokens)
    for i, token in enumerate(tokens):
        if i == unk:
            types[i] = UNKNOWN
        elif types[i] == NORMAL and BYTE_PIECE.fullmatch(token):
            types[i] = BYTE
        elif types[i] == NORMAL:
            scores[i] = -float(first_made.get(token, len(merges) + i))
    pieces = tokenizer.encode("a", add_special_tokens=False).tokens
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.add_space_prefix": bool(pieces) and pieces[0].startswith("\u2581")}
    return {**meta, **({"tokenizer.ggml.unknown_token_id": unk} if unk is not None else {})}


def _first_difference(ours: list[int], theirs: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))


def _structure(tokenizer: Tokenizer) -> tuple:
    spec = json.loads(tokenizer.to_str())
    return spec.get("normalizer"), spec.get("pre_tokenizer"), spec["model"].get("ignore_merges", False)


def _with_pre(meta: dict, tokenizer: Tokenizer, special: dict) -> dict:
    """`meta` with the pre-tokenizer name whose split gives the tokenizer's ids (module docstring)."""
    expected = tokenizer.encode(PROBE, add_special_tokens=False).ids
    matches = []
    for name in PRE_NAMES:
        candidate = {**meta, "tokenizer.ggml.pre": name}
        rebuilt = from_metadata({**candidate, **special})
        if rebuilt.encode(PROBE, add_special_tokens=False).ids == expected:
            if _structure(rebuilt) == _structure(tokenizer):
                return candidate
            matches.append(candidate)
    if matches:
        return matches[0]
    raise TokenizerMetadataError(f"the tokenizer's pre-tokenizer is none of those llama.cpp names that this exporter "
                                 f"writes ({', '.join(PRE_NAMES)}): each splits a probe text otherwise")


def tokenizer_metadata(tokenizer: Tokenizer, vocab_size: int, eos_id: int, special_ids: dict[str, int] | None = None,
                       chat_template: str | None = None) -> dict[str, Any]:
    """The `tokenizer.*` metadata of `tokenizer` for a model of `vocab_size` embedding rows (module
    docstring). `eos_id`: the end of sequence; `special_ids`: other ids by GGUF's name ("bos",
    "unknown", "padding"), where known; `chat_template`: the Jinja text, where the model has one."""
    spec = json.loads(tokenizer.to_str())
    kind = spec["model"]["type"]
    if kind != "BPE":
        raise TokenizerMetadataError(f"a {kind} tokenizer has no GGUF form: llama.cpp reads byte-level BPE (gpt2) and "
                                     f"SentencePiece (llama) vocabularies")
    tokens, types = _vocabulary(spec, vocab_size)
    bos, eos_added = _ends(tokenizer)
    ids = {"bos": bos, **{k: v for k, v in (special_ids or {}).items() if v is not None}, "eos": eos_id}
    special = {f"tokenizer.ggml.{name}_token_id": int(i) for name, i in ids.items() if i is not None}
    special.update({"tokenizer.ggml.add_bos_token": bos is not None,
                    "tokenizer.ggml.add_eos_token": eos_added is not None})
    if spec["model"].get("byte_fallback"):
        meta = _sentencepiece(tokenizer, spec, tokens, types)
    else:
        meta = _with_pre(_gpt2(spec, tokens, types), tokenizer, special)
    meta = {**meta, **special, **({"tokenizer.chat_template": chat_template} if chat_template else {})}
    expected = tokenizer.encode(PROBE, add_special_tokens=True).ids
    got = from_metadata(meta).encode(PROBE, add_special_tokens=True).ids
    if got != expected:
        at = _first_difference(expected, got)
        raise TokenizerMetadataError(f"the tokenizer's {meta['tokenizer.ggml.model']} form encodes a probe text "
                                     f"otherwise (from token {at}: {got[at:at + 3]} for {expected[at:at + 3]})")
    return meta
