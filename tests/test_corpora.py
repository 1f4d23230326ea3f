"""Sources, tokenizers and the evaluation protocol's token accounting."""
import numpy as np
import pytest

import corpora
from corpora import DataError, EvalWindows, eval_batches, load_lines
from tests.conftest import run_entry


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


def test_builtin_corpus_is_real_english_with_disjoint_splits():
    splits = {s: load_lines({"source": "builtin", "name": "python_docs"}, s) for s in ("train", "valid", "test")}
    text = {s: "\n".join(lines) for s, lines in splits.items()}
    assert len(text["train"]) > 500_000 and len(text["valid"]) > 20_000 and len(text["test"]) > 20_000
    words = text["train"].split()
    assert words.count("the") > 1000 and words.count("is") > 500
    assert text["valid"][:2000] not in text["train"]


def test_local_folder_layouts(tmp_path):
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    (wiki / "wiki.train.tokens").write_text(" = A = \n\n the cat \n")
    (wiki / "wiki.valid.tokens").write_text("a b\n")
    assert load_lines({"source": "local", "path": str(wiki)}, "train") == [" = A = ", "", " the cat "]
    plain = tmp_path / "plain"
    (plain / "validation").mkdir(parents=True)
    (plain / "validation" / "part1.txt").write_text("one\n")
    (plain / "validation" / "part2.txt").write_text("two\n")
    (plain / "test.txt").write_text("three\n")
    assert load_lines({"source": "local", "path": str(plain)}, "valid") == ["one", "two"]
    assert load_lines({"source": "local", "path": str(plain)}, "test") == ["three"]
    with pytest.raises(DataError, match="train_split"):
        load_lines({"source": "local", "path": str(plain)}, "train")


def test_missing_data_folder_says_which_option(tmp_path):
    with pytest.raises(DataError, match="--config.data.path"):
        load_lines({"source": "local", "path": str(tmp_path / "nope")}, "train")
    with pytest.raises(DataError, match="data.source"):
        load_lines({"source": "ftp"}, "train")


def test_hf_datasets_loader_on_a_local_dataset_folder(tmp_path):
    import datasets
    for split, rows in {"train": [" = T = \n", "\n", " x y \n"], "validation": [" v \n"],
                        "test": [" t \n"]}.items():
        datasets.Dataset.from_dict({"text": rows}).to_parquet(str(tmp_path / f"{split}.parquet"))
    cfg = {"source": "hf", "name": str(tmp_path), "hf_config": ""}
    assert load_lines(cfg, "train") == [" = T = ", "", " x y "]
    assert load_lines(cfg, "valid") == [" v "]


def test_hf_hub_offline_error_says_how_to_use_local_files():
    code = ("from corpora import load_lines\n"
            "load_lines({'source': 'hf', 'name': 'Salesforce/wikitext', 'hf_config': 'wikitext-103-v1'}, 'valid')")
    result = run_entry("-c", code, env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}, timeout=120)
    assert result.returncode != 0
    assert "--config.data.source=local" in result.stderr and "--config.data.path" in result.stderr


@pytest.mark.parametrize("n,length,stride", [(100, 10, 10), (101, 10, 10), (7, 10, 10), (100, 10, 3),
                                             (100, 10, 1), (1000, 64, 17), (64, 64, 5)])
def test_eval_windows_score_every_token_once_with_its_true_context(n, length, stride):
    stream = np.arange(1, n + 1, dtype=np.int32)  # token t has value t + 1; eos is 0
    seen = np.zeros(n, dtype=int)
    for inputs, targets, weights in eval_batches(stream, length, stride, batch_size=4, eos_id=0):
        assert inputs.shape == targets.shape == weights.shape == (4, length)
        scored = weights > 0
        np.add.at(seen, targets[scored] - 1, 1)
        # each input is the previous token of the stream (eos before the first)
        assert (inputs[scored] == targets[scored] - 1).all()
        for row in range(4):
            cols = np.nonzero(scored[row])[0]
            if len(cols):
                # the window is one contiguous piece of the stream, encoded from position 0 ...
                assert (np.diff(targets[row, : cols[-1] + 1]) == 1).all()
                # ... and every scored token has at least L - S tokens of context (fewer only at the start)
                assert cols[0] >= min(length - stride, targets[row, cols[0]] - 1)
    assert (seen == 1).all()
    assert len(EvalWindows(n, length, stride)) >= 1


def test_eval_windows_reject_bad_stride():
    with pytest.raises(ValueError, match="stride"):
        EvalWindows(100, 10, 11)


@pytest.mark.parametrize("split,expected", [("valid", 217_646), ("test", 245_569)])
@pytest.mark.parametrize("length,stride", [(512, 512), (3072, 3072), (15512, 15512), (1000, 1000),
                                           (512, 256), (1024, 7), (64, 1)])
def test_wikitext103_scores_every_token_once(wikitext103, split, expected, length, stride):
    """The paper's token counts: WikiText-103 valid 217,646 and test 245,569 (word level, with <eos>)."""
    lines = load_lines({"source": "local", "path": str(wikitext103)}, split)
    tok = corpora.build_tokenizer("word", lines)
    stream = tok.encode_lines(lines)
    assert corpora.count_words(lines) == len(stream) == expected
    total = sum(w.sum() for _, _, w in eval_batches(stream, length, stride, 256, tok.eos_id))
    assert total == expected
