"""Bad input gets one clear line, never a traceback from deep inside JAX."""

import posenc

from experiment import train
from tests.conftest import run_entry, tiny_config


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
