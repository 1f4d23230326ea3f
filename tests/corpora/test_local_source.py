"""Local folders of text files: the layouts they may have, and invalid UTF-8."""
import re

import pytest

from corpora import DataError, load_lines


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


def test_invalid_utf8_error_names_the_file_and_the_byte(tmp_path):
    (tmp_path / "wiki.train.tokens").write_bytes("ok é\n".encode() + b"caf\xe9\n")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'wiki.train.tokens'} is not valid UTF-8 (byte 9, line 2") + ".*iconv"):
        load_lines({"source": "local", "path": str(tmp_path)}, "train")
