"""A sweep's grid (experiment/pipeline/run.py): every point is the config it says, refused before any
run starts where it would not be."""
import pytest

from configs import extend
from experiment.pipeline.run import run_config, sweep
from tests.conftest import tiny_config


def test_a_grid_of_an_option_some_schemes_do_not_use_is_refused_before_any_run(tmp_path):
    """Issue 22, item 7: alibi,rope x rope.pi_factor=0.5,1 trained two identical alibi runs."""
    with pytest.raises(ValueError, match=r"--grid posenc.rope.pi_factor: .*this run uses alibi, not rope.*"
                                         r"identical alibi runs"):
        sweep(tiny_config("alibi"), ["alibi", "rope"], [], tmp_path / "grid", {"posenc.rope.pi_factor": ["0.5", "1"]})
    assert not (tmp_path / "grid").exists()
    with pytest.raises(ValueError, match="--grid posenc.name: the schemes of a sweep are --schemes"):
        run_config(tiny_config("alibi"), "alibi", None, {"posenc.name": "rope"})
    wrapped = run_config(tiny_config("alibi"), "logn", None, {"posenc.rope.pi_factor": "0.5"})  # logn wraps rope
    assert wrapped.posenc.rope.pi_factor == 0.5


@pytest.mark.parametrize("method,key,at_base_factor,at_128", [("yarn", "yarn_scale", 4.0, 2.0),
                                                              ("pi", "pi_factor", 0.25, 0.5)])
def test_a_context_extension_factor_follows_the_training_length(method, key, at_base_factor, at_128):
    """Issue 22, item 8: configs/extend.py:yarn,BASE with --train_lengths 128 kept yarn_scale=4 (128/64 = 2)."""
    base = extend.get_config(f"{method},runs/extend/base")
    assert run_config(base, "rope", None).posenc.rope[key] == at_base_factor
    assert run_config(base, "rope", 128).posenc.rope[key] == at_128
    assert run_config(base, "rope", None, {"train.seq_len": "128"}).posenc.rope[key] == at_128
    assert run_config(base, "rope", 128, {f"posenc.rope.{key}": "3"}).posenc.rope[key] == 3  # given: kept
    assert base.posenc.rope[key] == at_base_factor  # the base config is not changed by its grid points


def test_a_sweep_whose_report_folder_holds_other_files_is_refused_before_any_run(tmp_path):
    """Issue 32: no command writes into a folder it does not own; the sweep finds out before training."""
    (tmp_path / "grid" / "report").mkdir(parents=True)
    (tmp_path / "grid" / "report" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'grid' / 'report'} \(the sweep's report\) holds files that "
                                         r"report.py did not write \(notes.txt\); move it away"):
        sweep(tiny_config("alibi"), ["alibi"], [], tmp_path / "grid")
    assert sorted(p.name for p in (tmp_path / "grid").iterdir()) == ["report"]  # no run was started
