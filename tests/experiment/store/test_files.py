"""Every file of a run directory that is not a report input is either valid or reported as damaged
by name with the command that repairs it (experiment/store/run.py, experiment/store/files.py); a cache is
rebuilt. One run is trained for the module; each test damages a copy of it."""
import json
import math
import pathlib
import shutil

import numpy as np
import pytest

import corpora
from experiment import config as config_lib
from experiment.store import files
from experiment.train import train
from experiment.evals.common import load_checkpoint
from experiment.store.run import RunDir, RunError
from experiment.train import train
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trained")
    for split in ("train", "valid"):  # a local folder loads faster than the built-in corpus
        (folder / f"{split}.txt").write_text("the grass is green. the sky is blue. here we go.\n" * 40)
    config = tiny_config("alibi")
    config.data.update(dict(source="local", path=str(folder)))
    config.train.update(dict(steps=2, batch_size=2))
    train(config, folder / "run")
    return folder / "run", config


@pytest.fixture
def run(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained[0], copy, ignore=shutil.ignore_patterns(".lock"))
    return RunDir(copy)


@pytest.mark.parametrize("text,detail", [('{"seed": 0, "train": ', "Expecting value"), ("[]", "found a list"),
                                          (None, "train.lr must be > 0, got -1.0")], ids=["cut", "a list", "a value"])
def test_a_damaged_config_json_is_named_by_every_command(run, trained, text, detail):
    saved = json.loads(run.config_path.read_text())
    saved["train"]["lr"] = -1.0
    run.config_path.write_text(text if text is not None else json.dumps(saved))
    expected = rf"{run.config_path} is damaged \(.*{detail}.*\); it describes the checkpoints in .* put back a copy"
    with pytest.raises(RunError, match=expected):
        RunDir(run.path).load_config()  # what evaluation and reports read
    with pytest.raises(RunError, match=expected):
        train(trained[1], run.path)  # resuming


def test_a_damaged_tokenizer_is_named_with_how_to_rebuild_it(run):
    run.tokenizer_path.write_text('{"kind": "word"}')
    with pytest.raises(RunError, match=rf"{run.tokenizer_path} is damaged \(no 'words' in it\); delete it and run "
                                       r"this run's train.py command again: it is rebuilt from the train split"):
        run.tokenizer(run.load_config().data, write=False)


def test_a_damaged_token_stream_is_encoded_again_or_named(run, caplog):
    config, tokenizer = run.load_config(), run.tokenizer(run.load_config().data, write=False)
    good, words = run.stream(config.data, "train", tokenizer, write=False)
    stream = good.copy()
    stream[3] = tokenizer.vocab_size  # an id the vocabulary does not have
    np.save(run.stream_path("train"), stream)
    with pytest.raises(RunError, match=r"train.npy is damaged \(token ids outside the vocabulary of 256\); delete it"):
        run.stream(config.data, "train", tokenizer, write=False)  # a process that does not write
    again, again_words = run.stream(config.data, "train", tokenizer)  # the writer encodes the split again
    assert "train.npy is damaged" in caplog.text and np.array_equal(again, good) and again_words == words
    run.stream_path("train").write_bytes(run.stream_path("train").read_bytes()[:100])  # cut short
    assert np.array_equal(run.stream(config.data, "train", tokenizer)[0], good)


def test_a_checkpoint_with_a_damaged_meta_item_is_not_used(run):
    meta = next(run.checkpoints_dir.glob("2/meta/metadata"))
    meta.write_text(json.dumps({"data_position": 2}))
    config = run.load_config()
    with pytest.raises(RunError, match=r"no checkpoint in .* can be read with this run's config.json \(step 2: its "
                                       r"meta item is damaged .*rm -r .*checkpoints/2"):
        load_checkpoint(run, config, [16], {})


def test_damaged_init_from_json_and_lock_file_name_themselves(run):
    run.init_from_path.write_text('{"workdir": 3}')
    with pytest.raises(RunError, match=rf"{run.init_from_path} is damaged .* delete it \(rm {run.init_from_path}\)"):
        run.origin()


def test_a_failed_attempt_with_a_damaged_config_json_is_cleared(tmp_path):
    run = RunDir(tmp_path)
    run.config_path.write_text("{")
    run.tokenizer_path.write_text("{}")  # built by that attempt, from data nobody can tell now
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    run.clear_leftovers(config_lib.resolve(tiny_config("alibi")))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def short_write(path, array, *args, **kwargs):
    """np.save on a full device: part of the file, then numpy's error (no errno, no file name)."""
    pathlib.Path(path).write_bytes(b"\x93NUMPY" + b"\0" * 100)
    raise OSError(f"{array.nbytes} requested and 4064 written")


def test_a_full_device_while_a_token_stream_is_written_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """Issue 32: a 32-line traceback ending in `OSError: 21795 requested and 4064 written`."""
    from experiment.store.files import NoSpace
    run, tokenizer = RunDir(tmp_path / "run"), corpora.ByteTokenizer()
    lines = ["the grass is green"] * 20_000
    monkeypatch.setattr(np, "save", short_write)
    needed = f"{math.ceil((np.asarray(tokenizer.encode_lines(lines)).nbytes + 128) / 1e6)} MB needed"
    with pytest.raises(NoSpace) as error:
        run.stream(None, "valid", tokenizer, lines)
    assert str(error.value) == f"no space left on device: {run.stream_path('valid')} ({needed})"
    assert list(run.streams_dir.iterdir()) == []  # no half-written file left
    monkeypatch.undo()
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(NoSpace, match=rf"^no space left on device: {run.stream_path('valid')} \({needed}\)$"):
        run.stream(None, "valid", tokenizer, lines)  # refused before writing


def test_a_tokenizer_that_encodes_past_the_models_vocabulary_is_refused_not_clipped(tmp_path):
    """A --tokenizer larger than the model's embedding: the first evaluation recorded a NaN perplexity (a
    lookup past the embedding gives NaN), the next refused the cached stream as damaged."""
    class TooLarge:  # a pretrained tokenizer of 300 tokens for a model of 256 rows
        vocab_size = 256

        def encode_lines(self, lines):
            return np.array([5, 299, 7])
    run = RunDir(tmp_path / "run")
    with pytest.raises(RunError, match=r"^the valid split encodes to token id 299, past the model's vocabulary of 256: "
                                       r"the tokenizer \(.*tokenizer.json\) does not fit the model"):
        run.stream(None, "valid", TooLarge(), ["a line"])
    assert not run.streams_dir.exists()
