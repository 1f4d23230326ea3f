"""Tokenizers: byte-level, word-level (vocabulary from the train split, as fairseq builds it),
byte-level BPE trained locally on the train split with HF `tokenizers`, and a pretrained
checkpoint's own tokenizer.json (`pretrained`, made by import_hf.py).

All turn a list of lines into one flat stream with an end-of-line token after every line (the
pretrained kind: the checkpoint's end-of-sequence token). Each also has a `hf_tokenizer()`, the
same encoding of a line as a `tokenizers.Tokenizer`, which export_hf.py writes as tokenizer.json.
"""
from __future__ import annotations

import collections
import json
import pathlib
from typing import Iterable

import numpy as np

TOKENIZERS = ("byte", "word", "bpe", "pretrained")


class ByteTokenizer:
    """UTF-8 bytes; the end-of-line token is the newline byte."""
    kind = "byte"
    vocab_size = 256
    eos_id = ord("\n")

    def encode_lines(self, lines: Iterable[str]) -> np.ndarray:
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        return bytes(np.asarray(ids, dtype=np.uint8)).decode("utf-8", errors="replace")

    def to_json(self) -> dict:
        return {"kind": "byte"}

    def hf_tokenizer(self):
        """The same encoding as a `tokenizers.Tokenizer` (for a Hugging Face export): byte-level
        pre-tokenisation (each byte one character of GPT-2's byte alphabet) and a BPE model without
        merges whose vocabulary gives each byte's character the byte's value as its id."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        vocab = {char: byte for byte, char in byte_alphabet().items()}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        return tok


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character table (what byte-level BPE's pre-tokeniser maps each byte to): the
    printable Latin-1 bytes stand for themselves, the other 68 for the characters from U+0100 on."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]  # "!".."~", "¡".."¬", "®".."ÿ"
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


class WordTokenizer:
    """Whitespace-separated words; ids by descending train-split frequency, then alphabetically.

    Id 0 is `<eos>` (end of line), id 1 `<unk>` (words not in the vocabulary, and WikiText's own
    `<unk>` token). `max_size` > 0 keeps only the most frequent words.
    """
    kind = "word"
    EOS, UNK = "<eos>", "<unk>"
    eos_id, unk_id = 0, 1

    def __init__(self, words: list[str]):
        self.words = [self.EOS, self.UNK] + [w for w in words if w not in (self.EOS, self.UNK)]
        self.index = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def from_lines(cls, lines: Iterable[str], max_size: int = 0) -> "WordTokenizer":
        counts = collections.Counter(w for line in lines for w in line.split())
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        words = [w for w, _ in ranked]
        return cls(words[: max_size - 2] if max_size else words)

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode_lines(self, lines: Iterable[str]) -> np.ndarray:
        index, unk, eos = self.index, self.unk_id, self.eos_id
        ids: list[int] = []
        for line in lines:
            ids.extend(index.get(w, unk) for w in line.split())
            ids.append(eos)
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids) -> str:
        out, line = [], []
        for i in ids:
            if int(i) == self.eos_id:
                out.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(self.words[int(i)])
        return "".join(out) + " ".join(line)

    def to_json(self) -> dict:
        return {"kind": "word", "words": self.words[2:]}

    def hf_tokenizer(self):
        """The same encoding as a `tokenizers.Tokenizer`: whitespace split, word-level vocabulary."""
        from tokenizers import Tokenizer, models, pre_tokenizers
        tok = Tokenizer(models.WordLevel(vocab=self.index, unk_token=self.UNK))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return tok


class BPETokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation) trained on the train split; `<eos>` ends lines."""
    kind = "bpe"
    EOS = "<eos>"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.token_to_id(self.EOS)

    @classmethod
    def train(cls, lines: list[str], vocab_size: int) -> "BPETokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[cls.EOS], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(lines, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode_lines(self, lines: Iterable[str]) -> np.ndarray:
        ids: list[int] = []
        for enc in self.tokenizer.encode_batch(list(lines)):
            ids.extend(enc.ids)
            ids.append(self.eos_id)
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def to_json(self) -> dict:
        return {"kind": "bpe", "tokenizer": self.tokenizer.to_str()}

    def hf_tokenizer(self):
        return self.tokenizer


class PretrainedTokenizer:
    """A pretrained checkpoint's tokenizer.json (a `tokenizers.Tokenizer`), as import_hf.py takes it.

    `vocab_size` is the MODEL's vocabulary (its embedding rows, often padded beyond the tokenizer's
    own size), `eos_id` the checkpoint's end-of-sequence token. How lines become one stream is
    `line_end`:
    - "newline" (what import_hf.py gives a new run): the text as a file holds it, every line ended by
      a newline, encoded as one string without special tokens: the tokens the model itself was
      trained on, and the ids transformers' tokenizer gives for the same text.
    - "eos" (runs imported before it existed): each line encoded alone, `eos_id` appended after it, as
      the other kinds append their end-of-line token; `decode` turns `eos_id` back into a newline.
    Either way word counts of decoded text (word-level perplexity) match `count_words` of the lines."""
    kind = "pretrained"
    EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")
    LINE_ENDS = ("newline", "eos")

    def __init__(self, tokenizer, vocab_size: int, eos_id: int, line_end: str = "eos"):
        self.tokenizer, self.vocab_size, self.eos_id = tokenizer, int(vocab_size), int(eos_id)
        if not 0 <= self.eos_id < self.vocab_size:
            raise ValueError(f"end-of-sequence id {self.eos_id} is outside the model's vocabulary of {self.vocab_size}")
        if line_end not in self.LINE_ENDS:
            raise ValueError(f"line_end must be one of {', '.join(self.LINE_ENDS)}, got {line_end!r}")
        self.line_end = line_end

    def encode_lines(self, lines: Iterable[str]) -> np.ndarray:
        if self.line_end == "newline":
            text = "".join(line + "\n" for line in lines)
            return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int32)
        ids: list[int] = []
        for enc in self.tokenizer.encode_batch(list(lines), add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(self.eos_id)
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids) -> str:
        if self.line_end == "newline":
            return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        pieces, current = [], []
        for i in ids:
            if int(i) == self.eos_id:
                pieces.append(self.tokenizer.decode(current) + "\n")
                current = []
            else:
                current.append(int(i))
        return "".join(pieces) + (self.tokenizer.decode(current) if current else "")

    def to_json(self) -> dict:
        spec = {"kind": "pretrained", "tokenizer": self.tokenizer.to_str(), "vocab_size": self.vocab_size,
                "eos_id": self.eos_id}
        return {**spec, "line_end": self.line_end} if self.line_end != "eos" else spec

    def hf_tokenizer(self):
        return self.tokenizer


def build_tokenizer(kind: str, train_lines: list[str] | None = None, vocab_size: int = 0):
    """`vocab_size`: word: keep the most frequent (0 = all); bpe: the merges' target size (0 = 8192)."""
    if kind == "byte":
        return ByteTokenizer()
    if kind in ("word", "bpe") and train_lines is None:
        raise ValueError(f"a {kind} tokenizer needs the train split to build its vocabulary")
    if kind == "word":
        return WordTokenizer.from_lines(train_lines, vocab_size)
    if kind == "bpe":
        return BPETokenizer.train(train_lines, vocab_size or 8192)
    if kind == "pretrained":
        raise ValueError("data.tokenizer='pretrained' comes with a checkpoint: make the run with import_hf.py "
                         "(or start from one with train.init_from=WORKDIR), it is not built from the data")
    raise ValueError(f"unknown tokenizer {kind!r}; valid: {', '.join(TOKENIZERS)}")


def save_tokenizer(tokenizer, path: pathlib.Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(tokenizer.to_json()))
    tmp.replace(path)


def load_tokenizer(path: pathlib.Path):
    spec = json.loads(pathlib.Path(path).read_text())
    if spec["kind"] == "byte":
        return ByteTokenizer()
    if spec["kind"] == "word":
        return WordTokenizer(spec["words"])
    if spec["kind"] == "bpe":
        from tokenizers import Tokenizer
        return BPETokenizer(Tokenizer.from_str(spec["tokenizer"]))
    if spec["kind"] == "pretrained":
        from tokenizers import Tokenizer
        return PretrainedTokenizer(Tokenizer.from_str(spec["tokenizer"]), spec["vocab_size"], spec["eos_id"],
                                   spec.get("line_end", "eos"))
    raise ValueError(f"unknown tokenizer kind {spec['kind']!r} in {path}")


def count_words(lines: Iterable[str]) -> int:
    """Word-level token count of a split: whitespace words plus one end-of-line per line, the
    denominator of word-level perplexity (WikiText-103 valid: 217,646)."""
    return sum(len(line.split()) + 1 for line in lines)


def count_words_in_text(text: str) -> int:
    """The same count for decoded text (a prefix of a split): words plus newlines."""
    return len(text.split()) + text.count("\n")
