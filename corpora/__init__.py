"""Corpora: text sources, tokenizers, and the training / evaluation windows over a token stream."""
from corpora.batching import EvalWindows, eval_batches, train_batch
from corpora.builtin import builtin_lines
from corpora.passkey import PasskeyBatch, PasskeyError, PasskeyExample, mix_passkey, passkey_batch, passkey_example
from corpora.sources import DataError, check_splits, load_lines
from corpora.tokenizers import (BPETokenizer, ByteTokenizer, PretrainedTokenizer, WordTokenizer, build_tokenizer, count_words,
                                count_words_in_text,
                                load_tokenizer, save_tokenizer)

__all__ = ["EvalWindows", "eval_batches", "train_batch", "builtin_lines", "DataError", "check_splits", "load_lines",
           "BPETokenizer", "ByteTokenizer", "PretrainedTokenizer", "WordTokenizer", "build_tokenizer", "count_words", "count_words_in_text", "load_tokenizer",
           "save_tokenizer", "PasskeyBatch", "PasskeyError", "PasskeyExample", "mix_passkey", "passkey_batch",
           "passkey_example"]
