"""A GGUF file's tokenizer (its `tokenizer.*` metadata) as a `tokenizers.Tokenizer`, so that a GGUF
checkpoint comes with the same kind of tokenizer as a Hugging Face folder's tokenizer.json.

`tokenizer.ggml.model` names the form:
  gpt2   byte-level BPE: tokens, merges, and the pre-tokenizer `tokenizer.ggml.pre` names (the split
         llama.cpp applies before BPE, written here as the same split in `tokenizers` terms; PRE_TOKENIZERS)
  llama  SentencePiece BPE: tokens and scores; a pair merges where the joined piece is in the
         vocabulary, the highest-scoring first (the merge list is that order), bytes outside the
         vocabulary as <0xXX> tokens, spaces as U+2581, a space in front where add_space_prefix
A file that carries its whole tokenizer.json (`tokenizer.huggingface.json`) gives that instead.
Control tokens (token type 3) become special tokens, user-defined ones (4) added tokens; where
`tokenizer.ggml.add_bos_token` holds, the post-processor puts BOS first, as HF's tokenizer.json does.
"""
from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's stand-in for a space

_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")


def _byte_level(use_regex: bool = True):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=use_regex)


def _split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    _byte_level(use_regex=False)])


# tokenizer.ggml.pre -> (pre-tokenizer, normalizer, BPE's ignore_merges); "gpt-2" (llama.cpp's name),
# "gpt2" and "default": GPT-2's own split (ByteLevel's regex); "smollm": every digit alone first;
# "llama-bpe": Llama 3's split (numbers in threes) and whole words in the vocabulary taken as they
# are; "qwen2": Qwen2's split (single digits) after NFC, as its tokenizer.json has it.
PRE_TOKENIZERS = {
    "default": lambda: (_byte_level(), None, False),
    "gpt2": lambda: (_byte_level(), None, False),
    "gpt-2": lambda: (_byte_level(), None, False),  # llama.cpp's name of GPT-2's split (its converter writes it)
    "smollm": lambda: (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()]),
                       None, False),
    "llama-bpe": lambda: (_split_then_bytes(_LLAMA3_SPLIT), None, True),
    "qwen2": lambda: (_split_then_bytes(_QWEN2_SPLIT), normalizers.NFC(), False),
}
MODELS = ("gpt2", "llama")


class TokenizerMetadataError(ValueError):
    """Tokenizer metadata that cannot be built; the message is one line naming the key and why."""


def from_metadata(meta: dict[str, Any]) -> Tokenizer:
    """The tokenizer of a GGUF file's metadata (`meta`: key -> value, as models/formats/gguf.py
    reads them). TokenizerMetadataError where a key is missing or names a form not handled here."""
    if isinstance(meta.get("tokenizer.huggingface.json"), str):
        return Tokenizer.from_str(meta["tokenizer.huggingface.json"])
    model = meta.get("tokenizer.ggml.model")
    if model is None or "tokenizer.ggml.tokens" not in meta:
        raise TokenizerMetadataError("no tokenizer metadata (tokenizer.ggml.model, tokenizer.ggml.tokens); "
                                     "the model's tokenizer is needed to encode text")
    if model not in MODELS:
        raise TokenizerMetadataError(f"tokenizer.ggml.model {model!r} is not supported; supported: {', '.join(MODELS)}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise TokenizerMetadataError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    tokenizer = _gpt2(meta, tokens) if model == "gpt2" else _llama(meta, tokens, types)
    special = [AddedToken(tokens[i], normalized=False, special=True) for i, t in enumerate(types) if t == CONTROL]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens([AddedToken(tokens[i], normalized=False, special=False)
                          for i, t in enumerate(types) if t == USER_DEFINED])
    post = _post_processor(meta, tokens)
    if post is not None:
        tokenizer.post_processor = post
    return tokenizer


def _gpt2(meta: dict, tokens: list[str]) -> Tokenizer:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise TokenizerMetadataError(f"tokenizer.ggml.pre {pre!r} is not supported; supported: "
                                     f"{', '.join(PRE_TOKENIZERS)}")
    if "tokenizer.ggml.merges" not in meta:
        raise TokenizerMetadataError("a gpt2 tokenizer without tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    pre_tokenizer, normalizer, ignore_merges = PRE_TOKENIZERS[pre]()
    tokenizer = Tokenizer(BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's rule (join the adjacent pair whose joined piece scores
    highest): every split of every normal piece into two pieces of the vocabulary, ranked by the
    joined piece's score (then by id)."""
    mergeable = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
    ranked = sorted(mergeable.values(), key=lambda i: (-scores[i], i))
    merges = []
    for i in ranked:
        piece = tokens[i]
        pairs = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                 if piece[:k] in mergeable and piece[k:] in mergeable]
        merges.extend(sorted(pairs, key=lambda p: (mergeable[p[0]], mergeable[p[1]])))
    return merges


def _llama(meta: dict, tokens: list[str], types: list[int]) -> Tokenizer:
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise TokenizerMetadataError("a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores, one per token")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tokenizer = Tokenizer(BPE(vocab, spm_merges(tokens, list(scores), types), fuse_unk=True, byte_fallback=True,
                              unk_token=tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first" if prefix else "never",
                                                       split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tokenizer


def _post_processor(meta: dict, tokens: list[str]):
    """BOS first and/or EOS last where the metadata says to add them (as HF's tokenizer.json does)."""
    ends = []
    for key, which in (("add_bos_token", "bos_token_id"), ("add_eos_token", "eos_token_id")):
        add, index = meta.get(f"tokenizer.ggml.{key}", False), meta.get(f"tokenizer.ggml.{which}")
        if add and index is not None and 0 <= index < len(tokens):
            ends.append((tokens[index], int(index)))
        else:
            ends.append(None)
    bos, eos = ends
    if bos is None and eos is None:
        return None
    head, tail = ([bos[0]] if bos else []), ([eos[0]] if eos else [])
    single = head + ["$A"] + tail
    pair = single + head + ["$B:1"] + tail
    return processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                         special_tokens=sorted({e for e in ends if e is not None}))
