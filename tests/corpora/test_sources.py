"""Choosing a source (data.source) and checking splits before reading them."""
import re

import pytest

import corpora.local_source
from corpora import DataError, check_splits, load_lines


def test_missing_data_folder_says_which_option(tmp_path):
    with pytest.raises(DataError, match="--config.data.path"):
        load_lines({"source": "local", "path": str(tmp_path / "nope")}, "train")
    with pytest.raises(DataError, match="data.source"):
        load_lines({"source": "ftp"}, "train")


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
