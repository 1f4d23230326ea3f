"""Hugging Face datasets: local dataset folders, saved datasets, and failing fast without the hub."""
import pathlib
import re
import time

import pytest

import corpora.hf_source
from corpora import DataError, check_splits, load_lines


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


def test_hf_source_reads_and_checks_a_folder_of_data_files(tmp_path, no_hub):
    for split in ("train", "validation"):
        _text("x").to_parquet(str(tmp_path / f"{split}.parquet"))
    cfg = {**WIKITEXT_HUB, "path": str(tmp_path)}
    check_splits(cfg, ["train", "valid"])
    assert load_lines(cfg, "valid") == ["x"]
    with pytest.raises(DataError, match=r"no data files for split 'test' .*test.parquet"):
        check_splits(cfg, ["test"])
