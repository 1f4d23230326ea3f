"""models/formats/gguf_tokenizer.py on small vocabularies: each pre-tokenizer's defining split, special and
added tokens, BOS where the metadata asks for it, SentencePiece's highest-score-first merging with
byte fallback, and the refusals (one line naming the key)."""
from __future__ import annotations

import pytest
from tokenizers import pre_tokenizers

from models.formats.gguf_tokenizer import (BYTE, CONTROL, NORMAL, PRE_TOKENIZERS, SPACE, USER_DEFINED,
                                           TokenizerMetadataError, from_metadata)

ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())  # GPT-2's 256 byte characters
MERGES = ["Ġ t", "h e", "Ġt he", "1 2", "2 3", "4 5", "l l", "ll o", "e llo"]


def gpt2_meta(pre: str, merges=MERGES, extra_tokens=(), **more) -> dict:
    tokens = ["<|endoftext|>", *ALPHABET]
    for merge in merges:
        joined = merge.replace(" ", "")
        if joined not in tokens:
            tokens.append(joined)
    tokens += list(extra_tokens)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": list(merges), "tokenizer.ggml.token_type": [CONTROL] + [NORMAL] * (len(tokens) - 1),
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0, **more}


def pieces(tokenizer, text: str) -> list[str]:
    return [tokenizer.id_to_token(i) for i in tokenizer.encode(text).ids]


def test_every_form_round_trips_text():
    text = "the hello 12345 naïve  café\n\nend"
    for pre in PRE_TOKENIZERS:
        tokenizer = from_metadata(gpt2_meta(pre))
        assert tokenizer.decode(tokenizer.encode(text).ids) == text, pre


def test_gpt2_keeps_a_number_whole_smollm_splits_every_digit():
    """GPT-2's split keeps ' 12345' one piece (so the merge 1+2 applies); smollm cuts every digit first."""
    assert pieces(from_metadata(gpt2_meta("gpt2")), "a 12345") == ["a", "Ġ", "12", "3", "45"]
    assert pieces(from_metadata(gpt2_meta("default")), "a 12345") == ["a", "Ġ", "12", "3", "45"]
    assert pieces(from_metadata(gpt2_meta("smollm")), "a 12345") == ["a", "Ġ", "1", "2", "3", "4", "5"]


def test_llama_bpe_groups_digits_in_threes_and_takes_whole_words():
    """Llama 3: numbers in pieces of three, and a word in the vocabulary taken whole (ignore_merges)
    even where no merge builds it."""
    tokenizer = from_metadata(gpt2_meta("llama-bpe", extra_tokens=["Ġworld"]))
    assert pieces(tokenizer, "12345") == ["12", "3", "45"]
    assert pieces(tokenizer, " world") == ["Ġworld"]
    assert pieces(from_metadata(gpt2_meta("gpt2", extra_tokens=["Ġworld"])), " world") == list("Ġworld")


def test_qwen2_splits_single_digits_and_composes_unicode():
    tokenizer = from_metadata(gpt2_meta("qwen2"))
    assert pieces(tokenizer, "12345") == ["1", "2", "3", "4", "5"]
    assert tokenizer.encode("cafe\u0301").ids == tokenizer.encode("caf\u00e9").ids  # NFC
    assert from_metadata(gpt2_meta("gpt2")).encode("cafe\u0301").ids != tokenizer.encode("cafe\u0301").ids


def test_control_tokens_are_special_and_user_defined_ones_added():
    meta = gpt2_meta("gpt2", extra_tokens=["<tool>"])
    meta["tokenizer.ggml.token_type"][-1] = USER_DEFINED
    tokenizer = from_metadata(meta)
    assert tokenizer.encode("the<|endoftext|>the<tool>").ids == [
        *tokenizer.encode("the").ids, 0, *tokenizer.encode("the").ids, len(meta["tokenizer.ggml.tokens"]) - 1]


def test_bos_is_added_where_the_metadata_says():
    plain = from_metadata(gpt2_meta("llama-bpe"))
    with_bos = from_metadata(gpt2_meta("llama-bpe", **{"tokenizer.ggml.add_bos_token": True}))
    assert with_bos.encode("the").ids == [0, *plain.encode("the").ids]
    assert with_bos.encode("the", add_special_tokens=False).ids == plain.encode("the").ids


def spm_meta(prefix: bool = True) -> dict:
    normal = {"▁": -1.0, "a": -2.0, "b": -2.5, "c": -3.0, "▁a": -0.5, "ab": -1.5, "bc": -0.2, "abc": -0.1,
              "▁ab": -0.3, "▁b": -4.0}
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *normal]
    types = [2, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * len(normal)]
    scores = [0.0] * 259 + list(normal.values())
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_space_prefix": prefix}


def spm_reference(meta: dict, text: str) -> list[int]:
    """SentencePiece's BPE as llama.cpp runs it: join the adjacent pair whose joined piece is in the
    vocabulary with the highest score (leftmost first), then bytes for what is not a piece."""
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    vocab = {t: i for i, t in enumerate(tokens) if meta["tokenizer.ggml.token_type"][i] == NORMAL}
    symbols = list((" " + text if meta["tokenizer.ggml.add_space_prefix"] else text).replace(" ", SPACE))
    while True:
        joins = [(scores[vocab[a + b]], -i) for i, (a, b) in enumerate(zip(symbols, symbols[1:])) if a + b in vocab]
        if not joins:
            break
        i = -max(joins)[1]
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    return [i for s in symbols for i in ([vocab[s]] if s in vocab else
                                         [tokens.index(f"<0x{b:02X}>") for b in s.encode()])]


@pytest.mark.parametrize("prefix", [True, False])
def test_sentencepiece_merges_highest_score_first_with_byte_fallback(prefix):
    meta = spm_meta(prefix)
    tokenizer = from_metadata(meta)
    for text in ["abc", "a bc abc", "ab cab", "b a", "abé c", "cc  a"]:
        assert tokenizer.encode(text).ids == spm_reference(meta, text), text
        assert tokenizer.decode(tokenizer.encode(text).ids) == text, text


@pytest.mark.parametrize("meta,key", [
    ({}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]}, "'bert'"),
    (gpt2_meta("falcon"), "'falcon'"),
    ({**gpt2_meta("gpt2"), "tokenizer.ggml.merges": None}, "merges"),
    ({**spm_meta(), "tokenizer.ggml.scores": None}, "scores"),
])
def test_refusals_name_the_key(meta, key):
    meta = {k: v for k, v in meta.items() if v is not None}
    with pytest.raises(TokenizerMetadataError) as error:
        from_metadata(meta)
    assert key in str(error.value) and "\n" not in str(error.value)
    if "falcon" in key:
        assert all(name in str(error.value) for name in PRE_TOKENIZERS)


def test_bos_and_eos_both_added_where_asked():
    meta = gpt2_meta("gpt2", **{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    plain = from_metadata(gpt2_meta("gpt2"))
    assert from_metadata(meta).encode("the").ids == [0, *plain.encode("the").ids, 0]


def test_a_whole_tokenizer_json_in_the_metadata_is_taken_as_it_is():
    tokenizer = from_metadata(gpt2_meta("smollm"))
    embedded = from_metadata({"tokenizer.huggingface.json": tokenizer.to_str()})
    assert embedded.to_str() == tokenizer.to_str()
    assert embedded.encode("a 12345").ids == tokenizer.encode("a 12345").ids
