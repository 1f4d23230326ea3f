"""`data.source=hf`: Hugging Face `datasets`, from a local dataset folder or from the hub.

A local folder (`data.path`; or `data.name` when it names an existing folder) is read without
contacting the hub, whatever `data.name` says. It is either
- written by `save_to_disk`: a DatasetDict (sub-folders `train`, `validation`, `test`), one
  sub-folder per split each holding a saved Dataset, or a single saved Dataset. A single Dataset
  serves one split only: the split recorded in it (`load_dataset(..., split="validation")` records
  it), else the folder's own name if that is a split name (`.../validation`). One that records no
  split and has no split name is refused with the line that saves it as a DatasetDict;
- or a folder of data files (parquet, json, csv, ...) that `datasets.load_dataset(FOLDER)` reads,
  split by file names (`train.parquet`, `validation-00000.parquet`, ...). `data.hf_config` is used
  only when the folder has a README.md (a hub snapshot, whose card names its configs).
A hub name (`Salesforce/wikitext`) is loaded with `datasets.load_dataset`. When the hub is
unreachable (offline mode set, or no answer within HUB_TIMEOUT_S), only the local HF cache is
tried, at once, and one DataError says how to use a local folder instead.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import pathlib
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable

from corpora.splits import DataError, logical_split, split_aliases

STATE_FILE, INFO_FILE, DICT_FILE = "state.json", "dataset_info.json", "dataset_dict.json"
OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
HUB_TIMEOUT_S = 3.0
HF_SPLIT_NAMES = {"train": "train", "valid": "validation", "test": "test"}  # the names datasets uses
SAVE_AS_DICT = ("save all splits with datasets.DatasetDict({'train': train, 'validation': valid, 'test': test})"
                ".save_to_disk(FOLDER), or each split to FOLDER/train, FOLDER/validation, FOLDER/test with "
                "save_to_disk, and set --config.data.path=FOLDER")
LOCAL_INSTEAD = ("a local folder instead: --config.data.source=hf --config.data.path=FOLDER (written by datasets' "
                 "save_to_disk), or plain text files with --config.data.source=local --config.data.path=FOLDER "
                 "(wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens or train.txt, valid.txt, test.txt)")


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"


def is_unknown_split(e: Exception | None) -> bool:
    """Whether `datasets` refused a split name (so another alias may be tried)."""
    return isinstance(e, ValueError) and "split" in str(e).lower()


# ---- local folders -------------------------------------------------------------------------

def is_saved_dataset(folder: pathlib.Path) -> bool:
    """Whether `folder` holds one Dataset written by `Dataset.save_to_disk`."""
    return (folder / STATE_FILE).is_file() and (folder / INFO_FILE).is_file()


def saved_splits(folder: pathlib.Path) -> list[str]:
    """The sub-folders of `folder` that are saved Datasets (a saved DatasetDict's splits)."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and is_saved_dataset(p))


def is_saved_folder(folder: pathlib.Path) -> bool:
    """Whether `folder` was written by `save_to_disk` (a Dataset, a DatasetDict, or one per split)."""
    return is_saved_dataset(folder) or (folder / DICT_FILE).is_file() or bool(saved_splits(folder))


def recorded_split(folder: pathlib.Path) -> str | None:
    """The logical split a single saved Dataset serves: the one it records, else its folder's name."""
    try:
        recorded = json.loads((folder / STATE_FILE).read_text()).get("_split")
    except (OSError, ValueError):
        recorded = None
    return logical_split(str(recorded).split("[")[0]) if recorded else logical_split(folder.name)


def saved_split_folder(folder: pathlib.Path, split: str, option: str) -> pathlib.Path:
    """The saved Dataset that serves `split` in a folder written by `save_to_disk`; DataError if none."""
    for alias in split_aliases(split):
        if is_saved_dataset(folder / alias):
            return folder / alias
    if is_saved_dataset(folder):
        own = recorded_split(folder)
        if own == split:
            return folder
        holds = (f"a single Dataset of split {own!r}" if own else
                 "a single Dataset that records no split name (nor is the folder named after one)")
        raise DataError(f"--config.{option}={folder} (written by save_to_disk) holds {holds}, so it cannot "
                        f"serve split {split!r}; {SAVE_AS_DICT}")
    raise DataError(f"--config.{option}={folder} (written by save_to_disk) has no split {split!r} (it holds: "
                    f"{', '.join(saved_splits(folder)) or 'no split folders'}; names tried: "
                    f"{', '.join(split_aliases(split))}); {SAVE_AS_DICT}")


def dataset_folder(path: str) -> pathlib.Path:
    """The folder data.path names; DataError naming data.path when it is not there."""
    folder = pathlib.Path(path).expanduser()
    if not folder.is_dir():
        raise DataError(f"--config.data.path={path} does not exist; with data.source=hf it must be a folder written "
                        f"by datasets' save_to_disk or holding data files (parquet, json, csv, ...), or leave "
                        f"data.path empty to load --config.data.name from the Hugging Face hub")
    return folder


def not_a_dataset_folder(folder: pathlib.Path, option: str, e: Exception) -> DataError:
    return DataError(f"--config.{option}={folder} is not a dataset folder ({_first_line(e)}); it must be written "
                     f"by datasets' save_to_disk or hold data files (parquet, json, csv, ...); for plain text "
                     f"files use --config.data.source=local")


def folder_dataset(folder: pathlib.Path, split: str, hf_config: str, option: str):
    """One split of a local dataset folder (module docstring), without contacting the hub."""
    import datasets  # heavy; imported only when used

    if is_saved_folder(folder):
        return datasets.load_from_disk(str(saved_split_folder(folder, split, option)))
    config = (hf_config or None) if (folder / "README.md").is_file() else None
    with offline_hub():
        for alias in split_aliases(split):
            try:
                return datasets.load_dataset(str(folder), config, split=alias)
            except Exception as e:
                if not is_unknown_split(e):
                    raise not_a_dataset_folder(folder, option, e) from None
    raise DataError(f"--config.{option}={folder} has no data files for split {split!r}; name them after the "
                    f"split, e.g. {HF_SPLIT_NAMES[split]}.parquet")


def check_folder_splits(folder: pathlib.Path, splits: Iterable[str], option: str) -> None:
    """That each split has a saved Dataset or data files in `folder`, from the layout alone."""
    if is_saved_folder(folder):
        for split in splits:
            saved_split_folder(folder, split, option)
        return
    if (folder / "README.md").is_file():  # its card may define the splits: found only by loading
        return
    from datasets.data_files import get_data_patterns
    try:
        found = {str(s) for s in get_data_patterns(str(folder))}
    except Exception as e:
        raise not_a_dataset_folder(folder, option, e) from None
    for split in splits:
        if not found & set(split_aliases(split)):
            raise DataError(f"--config.{option}={folder} has no data files for split {split!r} (datasets finds "
                            f"splits {', '.join(sorted(found))} by file name); name them after the split, "
                            f"e.g. {HF_SPLIT_NAMES[split]}.parquet")


# ---- the hub -------------------------------------------------------------------------------

def offline_requested() -> bool:
    """Whether HF offline mode is set, in the environment or in already-imported `datasets`."""
    if any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_ENV):
        return True
    import datasets.config
    return bool(datasets.config.HF_HUB_OFFLINE)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HUB_TIMEOUT_S)
    except urllib.error.HTTPError:  # an HTTP status is an answer
        return True
    except (OSError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the hub endpoint answers an HTTP request within HUB_TIMEOUT_S (any status counts;
    a thread, so that a hanging name lookup cannot hold it longer)."""
    from huggingface_hub import constants
    answer: list[bool] = []
    probe = threading.Thread(target=lambda: answer.append(_answers(constants.ENDPOINT)), daemon=True)
    probe.start()
    probe.join(HUB_TIMEOUT_S)
    return bool(answer and answer[0])


@contextlib.contextmanager
def offline_hub():
    """Within: HF offline mode, so every hub request fails at once (only the local cache is read),
    even when `datasets` was imported before; restored after."""
    import datasets.config
    from huggingface_hub import constants
    saved = datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, constants.HF_HUB_OFFLINE = saved


def hub_dataset(name: str, hf_config: str, split: str):
    """One split of a hub dataset; offline (see the module docstring) only from the local HF cache."""
    import datasets
    from huggingface_hub import constants

    offline = "offline mode is set" if offline_requested() else (
        None if hub_reachable() else f"no answer from {constants.ENDPOINT} within {HUB_TIMEOUT_S:g} s")
    described = f"{name!r}{f' ({hf_config})' if hf_config else ''}"
    last_error: Exception | None = None
    with offline_hub() if offline else contextlib.nullcontext():
        for alias in split_aliases(split):
            try:
                return datasets.load_dataset(name, hf_config or None, split=alias)
            except Exception as e:
                last_error = e
                if not is_unknown_split(e):
                    break
    if is_unknown_split(last_error):
        raise DataError(f"dataset {described} has no split {split!r} (names tried: {', '.join(split_aliases(split))}; "
                        f"{_first_line(last_error)})")
    if offline:
        args = f"{name!r}{f', {hf_config!r}' if hf_config else ''}"
        raise DataError(f"the Hugging Face hub is unreachable ({offline}) and dataset {described} is not in the "
                        f"local HF cache; on a machine with internet run datasets.load_dataset({args})"
                        f".save_to_disk(FOLDER), copy it here and use {LOCAL_INSTEAD}")
    raise DataError(f"could not load split {split!r} of dataset {described} from the Hugging Face hub "
                    f"({_first_line(last_error)}); check --config.data.name and --config.data.hf_config, "
                    f"or use {LOCAL_INSTEAD}")


# ---- the source ----------------------------------------------------------------------------

def local_dataset_folder(path: str, name: str) -> tuple[pathlib.Path, str] | None:
    """(folder, the option naming it) when the config names a local folder; None for a hub name."""
    if path:
        return dataset_folder(path), "data.path"
    if name and pathlib.Path(name).expanduser().is_dir():
        return pathlib.Path(name).expanduser(), "data.name"
    return None


def hf_lines(path: str, name: str, hf_config: str, split: str, text_column: str = "text") -> list[str]:
    """One split's lines: the local folder `path` (or `name` if it is a folder), else hub `name`."""
    local = local_dataset_folder(path, name)
    if local:
        folder, option = local
        ds, described = folder_dataset(folder, split, hf_config, option), f"--config.{option}={folder}"
    else:
        ds, described = hub_dataset(name, hf_config, split), f"dataset {name!r}"
    if text_column not in ds.column_names:
        raise DataError(f"{described} has no column {text_column!r} (columns: {', '.join(ds.column_names)}); "
                        f"set --config.data.text_column")
    return [row.rstrip("\n") for row in ds[text_column]]


def check_hf_splits(path: str, name: str, splits: Iterable[str]) -> None:
    """For a local folder, that each split is there (from the layout, no data read); hub names are
    not checked (that needs the network)."""
    local = local_dataset_folder(path, name)
    if local:
        check_folder_splits(local[0], list(splits), local[1])
