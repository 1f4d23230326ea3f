"""Sources, tokenizers and the evaluation protocol's token accounting."""
import pathlib
import re
import time

import numpy as np
import pytest

import corpora
import corpora.hf_source
import corpora.local_source
from corpora import DataError, EvalWindows, check_splits, eval_batches, load_lines


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


WIKITEXT_HUB = {"source": "hf", "name": "Salesforce/wikitext", "hf_config": "wikitext-103-v1", "path": ""}


@pytest.fixture
def no_hub(monkeypatch):
    """Fails the test on any attempt to load a dataset from the hub (local folders must not need it)."""
    import datasets
    load_dataset = datasets.load_dataset

    def local_only(path, *args, **kwargs):
        if not pathlib.Path(path).is_dir():
            raise AssertionError(f"the hub was asked for {path!r}")
        return load_dataset(path, *args, **kwargs)
    monkeypatch.setattr(datasets, "load_dataset", local_only)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")


def _text(*rows, split=None):
    import datasets
    return datasets.Dataset.from_dict({"text": list(rows)}, split=split)


def test_hf_datasets_loader_on_a_local_dataset_folder(tmp_path, no_hub):
    import datasets
    for split, rows in {"train": [" = T = \n", "\n", " x y \n"], "validation": [" v \n"],
                        "test": [" t \n"]}.items():
        datasets.Dataset.from_dict({"text": rows}).to_parquet(str(tmp_path / f"{split}.parquet"))
    cfg = {"source": "hf", "name": str(tmp_path), "hf_config": ""}
    assert load_lines(cfg, "train") == [" = T = ", "", " x y "]
    assert load_lines(cfg, "valid") == [" v "]


def test_hf_source_reads_saved_dataset_dicts_and_per_split_folders(tmp_path, no_hub):
    import datasets
    datasets.DatasetDict({"train": _text(" = T = \n", " x \n"), "validation": _text(" v \n"),
                         "test": _text(" t \n")}).save_to_disk(str(tmp_path / "dict"))
    for split, rows in {"train": ["a"], "valid": ["b"], "test": ["c"]}.items():
        _text(*rows).save_to_disk(str(tmp_path / "per_split" / split))
    for folder, valid in (("dict", [" v "]), ("per_split", ["b"])):
        cfg = {**WIKITEXT_HUB, "path": str(tmp_path / folder)}  # data.name stays the hub's: the folder wins
        check_splits(cfg, ["train", "valid", "test"])
        assert load_lines(cfg, "valid") == valid
    assert load_lines({**WIKITEXT_HUB, "path": str(tmp_path / "dict")}, "train") == [" = T = ", " x "]


def test_hf_source_single_saved_dataset_serves_only_its_own_split(tmp_path, no_hub):
    _text("v1\n", "v2").save_to_disk(str(tmp_path / "validation"))  # named after its split
    _text("t1", split="test").save_to_disk(str(tmp_path / "recorded"))  # as load_dataset(split="test") saves
    _text("x").save_to_disk(str(tmp_path / "corpus"))  # no split anywhere
    named, recorded, anonymous = ({**WIKITEXT_HUB, "path": str(tmp_path / f)}
                                  for f in ("validation", "recorded", "corpus"))
    assert load_lines(named, "valid") == ["v1", "v2"]
    assert load_lines(recorded, "test") == ["t1"]
    with pytest.raises(DataError, match=r"single Dataset of split 'valid'.*DatasetDict\(\{'train'"):
        load_lines(named, "train")
    with pytest.raises(DataError, match=r"records no split name.*DatasetDict.*save_to_disk\(FOLDER\)"):
        load_lines(anonymous, "valid")
    with pytest.raises(DataError, match="single Dataset of split 'test'"):
        check_splits(recorded, ["train", "test"])


def test_hf_source_with_a_data_path_never_asks_the_hub(tmp_path, no_hub):
    absent = tmp_path / "absent"
    with pytest.raises(DataError, match=re.escape(f"--config.data.path={absent} does not exist")) as e:
        load_lines({**WIKITEXT_HUB, "path": str(absent)}, "train")
    assert "hub was asked" not in str(e.value)
    with pytest.raises(DataError, match=re.escape(f"--config.data.path={absent} does not exist")):
        check_splits({**WIKITEXT_HUB, "path": str(absent)}, ["train"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=re.escape(f"--config.data.path={tmp_path / 'empty'} is not a dataset folder")):
        load_lines({**WIKITEXT_HUB, "path": str(tmp_path / "empty")}, "train")
    check_splits(WIKITEXT_HUB, ["train", "valid"])  # a hub name: nothing to check without the network


def _assert_fast_one_line_offline_error(cfg, reason):
    start = time.monotonic()
    with pytest.raises(DataError) as e:
        load_lines(cfg, "valid")
    assert time.monotonic() - start < 5
    message = str(e.value)
    assert "\n" not in message and "the Hugging Face hub is unreachable" in message and reason in message
    assert "save_to_disk" in message and "--config.data.source=hf --config.data.path=FOLDER" in message
    assert "--config.data.source=local --config.data.path=FOLDER" in message


def test_hub_offline_mode_fails_at_once_with_one_line_saying_how_to_use_a_local_folder(monkeypatch):
    monkeypatch.setattr(corpora.hf_source, "hub_reachable", lambda: pytest.fail("offline mode must not probe"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # set after `datasets` was imported: must still count
    _assert_fast_one_line_offline_error({**WIKITEXT_HUB, "name": "lengthx-tests/not-cached"}, "offline mode is set")


def test_unreachable_hub_fails_at_once_without_retries(monkeypatch):
    import datasets.config
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(corpora.hf_source, "hub_reachable", lambda: False)
    _assert_fast_one_line_offline_error({**WIKITEXT_HUB, "name": "lengthx-tests/not-cached"}, "no answer from")
    assert datasets.config.HF_HUB_OFFLINE is False  # offline only for that load


def test_invalid_utf8_error_names_the_file_and_the_byte(tmp_path):
    (tmp_path / "wiki.train.tokens").write_bytes("ok é\n".encode() + b"caf\xe9\n")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'wiki.train.tokens'} is not valid UTF-8 (byte 9, line 2") + ".*iconv"):
        load_lines({"source": "local", "path": str(tmp_path)}, "train")


def test_check_splits_names_missing_split_files_without_reading_them(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora.local_source, "read_lines", lambda path: pytest.fail("read " + str(path)))
    (tmp_path / "wiki.train.tokens").write_text("a b\n")
    cfg = {"source": "local", "path": str(tmp_path)}
    check_splits(cfg, ["train", "train"])
    with pytest.raises(DataError, match=re.escape(f"no file for splits 'valid', 'test' in --config.data.path={tmp_path} ") + ".*wiki.valid.tokens"):
        check_splits(cfg, ["train", "valid", "test"])
    (tmp_path / "wiki.valid.tokens").write_text("")
    with pytest.raises(DataError, match="split 'valid' .* empty: wiki.valid.tokens"):
        check_splits(cfg, ["valid"])
    with pytest.raises(DataError, match="unknown split 'validation'"):
        check_splits(cfg, ["validation"])
    check_splits({"source": "builtin", "name": "python_docs"}, ["train", "valid", "test"])
    with pytest.raises(DataError, match="--config.data.name"):
        check_splits({"source": "builtin", "name": "wikipedia"}, ["train"])


def test_hf_source_reads_and_checks_a_folder_of_data_files(tmp_path, no_hub):
    for split in ("train", "validation"):
        _text("x").to_parquet(str(tmp_path / f"{split}.parquet"))
    cfg = {**WIKITEXT_HUB, "path": str(tmp_path)}
    check_splits(cfg, ["train", "valid"])
    assert load_lines(cfg, "valid") == ["x"]
    with pytest.raises(DataError, match=r"no data files for split 'test' .*test.parquet"):
        check_splits(cfg, ["test"])


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
