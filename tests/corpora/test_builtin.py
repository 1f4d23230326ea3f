"""The built-in corpus (Python's documentation): real English, disjoint splits."""
from corpora import load_lines


def test_builtin_corpus_is_real_english_with_disjoint_splits():
    splits = {s: load_lines({"source": "builtin", "name": "python_docs"}, s) for s in ("train", "valid", "test")}
    text = {s: "\n".join(lines) for s, lines in splits.items()}
    assert len(text["train"]) > 500_000 and len(text["valid"]) > 20_000 and len(text["test"]) > 20_000
    words = text["train"].split()
    assert words.count("the") > 1000 and words.count("is") > 500
    assert text["valid"][:2000] not in text["train"]
