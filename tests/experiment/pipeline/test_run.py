"""A sweep's grid (experiment/pipeline/run.py): every point is the config it says, refused before any
run starts where it would not be; seeds as one more axis, a folder per seed."""
import pathlib

import pytest

from configs import extend
from experiment.pipeline import run as pipeline
from experiment.pipeline.run import resolve_runs, run_config, sweep
from tests.conftest import run_entry, tiny_config
from tests.experiment.test_cli import assert_clean_error


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


def test_seeds_are_a_sweep_axis_one_folder_each_the_configs_own_seed_keeping_its_name(tmp_path, monkeypatch):
    """sweep.py --seeds 0,1,2: each point once per seed, the config's seed (0) in today's folder, the
    others in <name>_seed<N>; every point's first seed before any second one; complete runs skipped."""
    trained, reported = [], []

    def fake_train(config, workdir, skip_done=False):
        assert skip_done  # a sweep going on: what a run lacks, no more (test_a_resumed_sweep_...)
        trained.append((pathlib.Path(workdir).name, config.seed))
    monkeypatch.setattr(pipeline, "train_and_evaluate", fake_train)
    monkeypatch.setattr(pipeline, "write_report", lambda workdirs, out: reported.append(
        [pathlib.Path(w).name for w in workdirs]) or {"png": "", "md": ""})
    base = tiny_config("alibi")
    sweep(base, ["alibi", "rope"], [], tmp_path, {"train.steps": ["3"]}, seeds=[2, 0, 1])
    assert trained == [("alibi_L16_steps3", 0), ("rope_L16_steps3", 0), ("alibi_L16_steps3_seed2", 2),
                       ("rope_L16_steps3_seed2", 2), ("alibi_L16_steps3_seed1", 1), ("rope_L16_steps3_seed1", 1)]
    assert reported == [[name for name, _ in trained]]
    configs = resolve_runs(base, tmp_path, [(None, "alibi", None, {"seed": "7"}),
                                            ("named", "rope", None, {"seed": "3"})])
    assert {path.name: config.seed for path, config in configs.items()} == {"alibi_L16_seed7": 7, "named_seed3": 3}
    base.seed = 3  # a config whose own seed is 3: that seed keeps the plain name
    assert [p.name for p in resolve_runs(base, tmp_path, [(None, "alibi", None, {"seed": "3"})])] == ["alibi_L16"]


def test_a_resumed_sweep_trains_no_trained_run_and_asks_only_for_what_it_lacks(tmp_path, monkeypatch):
    """A trained run is evaluated through evaluate_kinds with skip_done (which restores nothing where
    every record is there: tests/experiment/evals/test_kinds.py), as config.eval says."""
    asked = []
    monkeypatch.setattr(pipeline, "is_trained", lambda workdir, config: True)
    monkeypatch.setattr(pipeline, "train", lambda *a, **k: pytest.fail("a trained run was trained again"))
    monkeypatch.setattr(pipeline, "evaluate_kinds", lambda run, kinds, request: asked.append((kinds, request)) or {
        "perplexity": []})
    monkeypatch.setattr(pipeline, "write_report", lambda workdirs, out: {})
    base = tiny_config("alibi")
    base.eval.overrides = "model.attention=dense"
    sweep(base, ["alibi"], [], tmp_path, seeds=[0, 1])
    assert [kinds for kinds, _ in asked] == [("perplexity",)] * 2
    request = asked[0][1]
    assert request.skip_done and request.skip_impossible and request.lengths == (16, 32)
    assert request.overrides == {"model.attention": "dense"}


def test_seeds_given_twice_or_as_a_grid_are_refused_before_any_run(tmp_path):
    with pytest.raises(ValueError, match=r"^--seeds 0,1,1: seed 1 is given twice; give each once \(--seeds 0,1\)$"):
        sweep(tiny_config("alibi"), ["alibi"], [], tmp_path / "grid", seeds=[0, 1, 1])
    with pytest.raises(ValueError, match=r"^--grid seed=0,1: the seeds of a sweep are --seeds \(e.g. --seeds 0,1\)"):
        sweep(tiny_config("alibi"), ["alibi"], [], tmp_path / "grid", {"seed": ["0", "1"]})
    assert not (tmp_path / "grid").exists()


def test_sweep_py_takes_seeds_and_refuses_a_negative_one_in_one_line(tmp_path):
    result = run_entry("sweep.py", "--config", "configs/demo.py", "--schemes", "alibi", "--seeds", "0,-1",
                       "--workdir", str(tmp_path / "grid"))
    assert_clean_error(result, "--seeds", "--seeds=0,1,2")
    assert not (tmp_path / "grid").exists()
