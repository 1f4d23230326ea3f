"""Bad input gets one clear line, never a traceback from deep inside JAX."""
import errno
import json
import sys

import pytest
from absl import flags
from ml_collections import config_flags

import posenc
from experiment.train import train
from experiment.cli import _load_config, parse_flags
from experiment.train import train
from tests.conftest import REPO, run_entry, tiny_config


def assert_clean_error(result, *needles):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    for needle in needles:
        assert needle in result.stderr, result.stderr[-2000:]


def test_unknown_scheme(tmp_path):
    result = run_entry("train.py", "--config", "configs/demo.py", "--config.posenc.name=alibee",
                       "--workdir", str(tmp_path / "run"))
    assert_clean_error(result, "alibee", ", ".join(posenc.names()))


def test_unknown_config_key(tmp_path):
    result = run_entry("train.py", "--config", "configs/demo.py", "--config.train.stpes=3",
                       "--workdir", str(tmp_path / "run"))
    assert_clean_error(result, "train.stpes", "steps")


def test_missing_config_file(tmp_path):
    result = run_entry("train.py", "--config", "configs/nope.py", "--workdir", str(tmp_path))
    assert_clean_error(result, "configs/nope.py")


def test_missing_data_folder(tmp_path):
    result = run_entry("train.py", "--config", "configs/demo.py", "--config.data.source=local",
                       f"--config.data.path={tmp_path / 'absent'}", "--workdir", str(tmp_path / "run"))
    assert_clean_error(result, "absent", "--config.data.path")


def test_eval_without_checkpoint(tmp_path):
    result = run_entry("eval_extrapolate.py", "--workdir", str(tmp_path))
    assert_clean_error(result, "train first")


def test_learned_table_too_short_for_eval_length(tmp_path):
    config = tiny_config("learned")
    config.train.steps = 1
    train(config, tmp_path)
    result = run_entry("eval_extrapolate.py", "--workdir", str(tmp_path), "--lengths", "16,64")
    assert_clean_error(result, "learned", "16 positions", "--config.posenc.learned.max_length=64")


def test_report_without_results(tmp_path):
    result = run_entry("report.py", str(tmp_path), "--out", str(tmp_path / "r"))
    assert_clean_error(result, "eval_extrapolate.py")


CONFIGS = sorted(f"configs/{p.name}" for p in (REPO / "configs").glob("*.py") if p.name != "__init__.py")


def sequence_keys(config, prefix: str = "") -> dict:
    """Dotted key -> value of every list- or tuple-valued key."""
    found = {}
    for key, value in config.items():
        if hasattr(value, "items"):
            found.update(sequence_keys(value, f"{prefix}{key}."))
        elif isinstance(value, (list, tuple)):
            found[f"{prefix}{key}"] = value
    return found


SEQUENCES = {path: sequence_keys(_load_config(["train.py", "--config", str(REPO / path)])) for path in CONFIGS}
SEQUENCE_KEYS = [(path, key) for path in CONFIGS for key in SEQUENCES[path]]


def parse_config(monkeypatch, path: str, *overrides: str):
    """The config that `train.py --config PATH OVERRIDES...` would run, parsed in this process."""
    argv = ["train.py", "--config", str(REPO / path), *overrides, "--workdir", "unused"]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags finds the override names in sys.argv
    monkeypatch.delenv("LX_TRACEBACK", raising=False)
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "config", flag_values=flag_values, lock_config=True)
    flags.DEFINE_string("workdir", None, "run directory", flag_values=flag_values)
    parse_flags(argv, flag_values)
    return flag_values.config


def test_every_sequence_key_is_a_tuple():
    """ml_collections overrides tuple-valued keys only; a list would refuse --config.KEY=..."""
    assert {"eval.lengths", "eval.length_multipliers", "model.adaptive_cutoffs"} <= set(SEQUENCES["configs/demo.py"])
    assert any(value == () for keys in SEQUENCES.values() for value in keys.values())  # an empty default
    for path, keys in SEQUENCES.items():
        for key, value in keys.items():
            assert isinstance(value, tuple), (path, key, value)


@pytest.mark.parametrize("path,key", SEQUENCE_KEYS, ids=[f"{p[8:-3]}:{k}" for p, k in SEQUENCE_KEYS])
@pytest.mark.parametrize("text,expected", [("512,1024", (512, 1024)), ("(512,1024)", (512, 1024)),
                                           ("(64, 128, 256)", (64, 128, 256)), ("[8]", (8,)), ("7", (7,)),
                                           ("()", ()), ("", ()), ("1,1.5", (1, 1.5))])
def test_sequence_override_parses(monkeypatch, path, key, text, expected):
    config = parse_config(monkeypatch, path, f"--config.{key}={text}")
    section, leaf = key.rsplit(".", 1)
    value = config[section][leaf]
    assert value == expected and isinstance(value, tuple), value
    assert [type(v) for v in value] == [type(v) for v in expected]  # ints stay ints


@pytest.mark.parametrize("path", CONFIGS)
def test_sequence_override_as_separate_argument_and_repeated(monkeypatch, path):
    """A key given twice takes its last value, as a scalar key does (ml_collections joined the tuples)."""
    config = parse_config(monkeypatch, path, "--config.eval.lengths", "32,64", "--config.eval.length_multipliers=2",
                          "--config.eval.length_multipliers=3", "--config.eval.lengths=64,128", "--config.eval.lengths",
                          "256")
    assert config.eval.lengths == (256,) and config.eval.length_multipliers == (3,)


@pytest.mark.parametrize("path,key", SEQUENCE_KEYS, ids=[f"{p[8:-3]}:{k}" for p, k in SEQUENCE_KEYS])
@pytest.mark.parametrize("text", ["abc", "512,abc", "(1,'x')", "true"])
def test_bad_sequence_element_names_the_key(monkeypatch, capsys, path, key, text):
    with pytest.raises(SystemExit) as exit_:
        parse_config(monkeypatch, path, f"--config.{key}={text}")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --config.{key}={text}: ") and "not a number" in err, err


def test_list_valued_key_is_refused_by_name(monkeypatch, capsys, tmp_path):
    (tmp_path / "listy.py").write_text("import ml_collections\n"
                                       "def get_config():\n"
                                       "    return ml_collections.ConfigDict(dict(eval=dict(lengths=[1, 2])))\n")
    with pytest.raises(SystemExit) as exit_:
        parse_config(monkeypatch, str(tmp_path / "listy.py"), "--config.eval.lengths=3")
    assert exit_.value.code == 2
    assert "'eval.lengths' holds a list" in capsys.readouterr().err


def test_sequence_override_reaches_the_run(tmp_path):
    result = run_entry("train.py", "--config", "configs/demo.py", "--config.eval.lengths=(64,128)",
                       "--config.model.adaptive_cutoffs=100,200", "--max_steps=0", "--workdir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eval"]["lengths"] == [64, 128] and config["model"]["adaptive_cutoffs"] == [100, 200]


def parse_numbers(monkeypatch, capsys, *args: str) -> str:
    """stderr of parsing `args` against flags defined with define_numbers, as eval_extrapolate.py does."""
    from experiment.cli import define_numbers
    from posenc.domains import at_least, unit_interval
    flag_values = flags.FlagValues()
    define_numbers("lengths", None, "", domain=at_least(1), example="--lengths=64,128", flag_values=flag_values)
    define_numbers("passkey_depths", [0.5], "", kind=float, domain=unit_interval(), example="--passkey_depths=0,1",
                   flag_values=flag_values)
    define_numbers("stride", None, "", domain=at_least(0), example="--stride=32", sequence=False,
                   flag_values=flag_values)
    monkeypatch.delenv("LX_TRACEBACK", raising=False)
    try:
        parse_flags(["eval_extrapolate.py", *args], flag_values)
    except SystemExit as exit_:
        assert exit_.code == 2
        return capsys.readouterr().err
    return repr((flag_values.lengths, flag_values.passkey_depths, flag_values.stride))


@pytest.mark.parametrize("args,expected", [
    (["--lengths=16,abc"], "error: flag --lengths=16,abc: 'abc' is not a whole number >= 1 (e.g. --lengths=64,128)"),
    (["--lengths=0"], "'0' is not a whole number >= 1"),
    (["--passkey_depths=x"], "error: flag --passkey_depths=x: 'x' is not a number in [0, 1]"),
    (["--passkey_depths=0,1.5"], "'1.5' is not a number in [0, 1]"),
    (["--stride=-1"], "error: flag --stride=-1: '-1' is not a whole number >= 0"),
    (["--lengths=64,128", "--passkey_depths=0,1", "--stride=0"], "([64, 128], [0.0, 1.0], 0)"),
], ids=["lengths", "length 0", "depths", "depth 1.5", "stride", "valid"])
def test_number_flags_are_checked_as_they_are_parsed_naming_the_flag(monkeypatch, capsys, args, expected):
    """Issue 22, item 13: `invalid literal for int() with base 10: 'abc'`, without the flag."""
    assert expected in parse_numbers(monkeypatch, capsys, *args)


@pytest.mark.parametrize("body,expected", [
    ("return {'seed': 0, 'train': {'steps': 2}}", "get_config() returned a dict; return an ml_collections.ConfigDict"),
    ("return ml_collections.ConfigDict({'seed': 0, 'train': {'steps': 2}})", "get_config(): the config has no "
     "posenc section"),
    ("c = defaults(); c.model = ml_collections.ConfigDict(); c.model.nosuch = 1; return c", "model.nosuch"),
], ids=["a dict", "no posenc", "an unknown key"])
def test_a_config_file_of_the_wrong_shape_is_one_line(monkeypatch, capsys, tmp_path, body, expected):
    """Issue 22, item 14: ~45-line tracebacks from the first use of the config."""
    path = tmp_path / "odd.py"
    path.write_text(f"import ml_collections\nfrom experiment.config import defaults\ndef get_config():\n    {body}\n")
    with pytest.raises(SystemExit) as exit_:
        parse_config(monkeypatch, str(path))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and expected in err and "Traceback" not in err, err


@pytest.mark.parametrize("error,named", [
    (OSError(errno.ENOSPC, "No space left on device", "/data/run/streams/train.npy"), "/data/run/streams/train.npy"),
    (RuntimeError("orbax: Failed to write"), "/data/run/checkpoints/0"),
    (OSError("21795 requested and 4064 written"), "a file")], ids=["ENOSPC", "wrapped", "short write"])
def test_a_full_device_is_one_line_whatever_library_raised_it(monkeypatch, capsys, error, named):
    """Issue 32: 289 lines of orbax tracebacks, or `OSError: 21795 requested and 4064 written`."""
    import experiment.cli as cli
    monkeypatch.setattr(cli, "start_runtime", lambda *a: None)
    monkeypatch.delenv("LX_TRACEBACK", raising=False)

    def fails():
        if isinstance(error, RuntimeError):
            raise error from OSError(errno.ENOSPC, "No space left on device", "/data/run/checkpoints/0")
        raise error
    with pytest.raises(SystemExit) as exit_:
        cli.run_cleanly(fails)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err == [f"error: no space left on device: {named}"], err


@pytest.mark.parametrize("spec,expected", [
    ("configs/wikitext103.py:alibi,abc", "error: --config configs/wikitext103.py:alibi,abc: the training length L "
     "(after the scheme) must be a whole number >= 1, got 'abc'; e.g. --config configs/wikitext103.py:alibi,512"),
    ("configs/wikitext103.py:rope,-5", "the training length L (after the scheme) must be a whole number >= 1, got '-5'"),
    ("configs/extend.py:pi,runs/none,x", "error: --config configs/extend.py:pi,runs/none,x: FACTOR (after the base "
     "folder) must be a whole number >= 1, got 'x'; e.g. --config configs/extend.py:pi,runs/none,4")],
    ids=["L", "negative L", "factor"])
def test_a_bad_part_of_a_config_argument_is_named(monkeypatch, capsys, spec, expected):
    """Issue 32: configs/wikitext103.py:alibi,abc gave `invalid literal for int()`, naming no part."""
    with pytest.raises(SystemExit):
        parse_config(monkeypatch, spec)
    err = capsys.readouterr().err
    assert expected in err and "invalid literal" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("override", ["--config.train.steps=3", "--config.posenc.name=rope",
                                      "--config.model.num_layers=2"])
def test_a_config_file_returning_a_dict_with_an_override_is_one_line(monkeypatch, capsys, tmp_path, override):
    """Issue 32: alone it was one good line; with --config.posenc.name= or a key the dict lacks, a
    45-line traceback (ml_collections' KeyError, then ours on `config.posenc` of a dict)."""
    path = tmp_path / "odd.py"
    path.write_text("def get_config():\n    return {'seed': 0, 'train': {'steps': 2}}\n")
    with pytest.raises(SystemExit) as exit_:
        parse_config(monkeypatch, str(path), override)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err, err
    assert err.splitlines()[0] == (f"error: {path}: get_config() returned a dict; return an ml_collections.ConfigDict "
                                   "(start from experiment.config.defaults(scheme)), which --config.KEY=VALUE can "
                                   "override")
