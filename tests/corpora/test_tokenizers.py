"""Byte and word tokenizers: an end-of-line token after every line, vocabulary, save and load."""
import corpora


def test_byte_tokenizer_ends_every_line_with_newline():
    tok = corpora.ByteTokenizer()
    ids = tok.encode_lines(["ab", "", "é"])
    assert ids.tolist() == [97, 98, 10, 10, 0xC3, 0xA9, 10]
    assert tok.vocab_size == 256 and tok.eos_id == 10


def test_word_tokenizer_vocabulary_from_train_split():
    tok = corpora.WordTokenizer.from_lines(["b a a", "c a b", "<unk> d"])
    assert tok.words[:2] == ["<eos>", "<unk>"]
    assert tok.words[2:5] == ["a", "b", "c"]  # by frequency, then alphabetically
    ids = tok.encode_lines(["a zzz", "<unk>"])
    assert ids.tolist() == [tok.index["a"], tok.unk_id, tok.eos_id, tok.unk_id, tok.eos_id]
    small = corpora.WordTokenizer.from_lines(["b a a", "c a b"], max_size=3)
    assert small.vocab_size == 3


def test_tokenizer_save_and_load(tmp_path):
    tok = corpora.WordTokenizer.from_lines(["x y y"])
    corpora.save_tokenizer(tok, tmp_path / "t.json")
    again = corpora.load_tokenizer(tmp_path / "t.json")
    assert again.words == tok.words
