"""The run directory (experiment/store/run.py): one owner, a lock, leftovers of failed attempts, damaged
checkpoints (and TensorBoard's view of a run resumed from an older one), stale evaluation records,
unattended logs, and the CLI's refusals."""
import json
import subprocess
import sys
import types

import numpy as np
import pytest

from experiment import config as config_lib
from experiment.evals import evaluate
from experiment.store import checkpoints, records, run as run_lib
from experiment.store.run import RunDir, WorkdirBusy, opened
from experiment.train import train
from experiment.train.metrics import TrainingDiverged
from tests.conftest import REPO, run_entry, tiny_config
from tests.experiment.store.test_tensorboard import run_scalars


def test_lock_refuses_a_second_process_and_is_released_when_its_holder_dies(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from experiment.store.run import RunDir\n"
         f"with RunDir({str(tmp_path)!r}).locked('training'):\n    print('held', flush=True); time.sleep(60)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirBusy, match=rf"in use by training \(pid {holder.pid} "):
            with RunDir(tmp_path).locked("evaluation"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with opened(tmp_path, "training") as run:  # the kernel dropped the dead holder's lock
        assert run.held
        with opened(run, "evaluation") as inner:  # an open run is handed on: the lock is taken once
            assert inner is run
        with pytest.raises(WorkdirBusy):  # a second RunDir of the same folder is another holder
            with RunDir(tmp_path).locked("evaluation"):
                pass
    assert not run.held


def test_a_second_train_on_a_busy_workdir_refuses_and_writes_nothing(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    before = sorted(p.name for p in tmp_path.iterdir())
    with RunDir(tmp_path).locked("training"):
        # a second process: the CLI, as a user would start it (same config, requeued job)
        out = run_entry("train.py", "--config", "configs/demo.py", "--workdir", str(tmp_path),
                        "--config.train.steps=2")
    assert out.returncode == 2 and "is in use by training" in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + [".lock"])
    assert (tmp_path / "config.json").read_text() == "{}"


def test_work_that_writes_nothing_leaves_no_folder_or_lock_behind(tmp_path):
    nested = tmp_path / "a" / "b" / "run"
    with RunDir(nested).locked("training"):
        assert (nested / ".lock").exists()
    assert list(tmp_path.iterdir()) == []  # the folders it created went with the lock
    kept = tmp_path / "kept"
    kept.mkdir()
    with RunDir(kept).locked("training"):
        (kept / "config.json").write_text("{}")
    assert sorted(p.name for p in kept.iterdir()) == [".lock", "config.json"]
    with RunDir(tmp_path / "given").locked("training"):
        pass
    out = run_entry("train.py", "--config", "configs/demo.py", "--workdir", str(tmp_path / "cli"),
                    "--config.data.source=local", "--config.data.path", str(tmp_path / "no_such_folder"))
    assert out.returncode == 2 and "does not exist" in out.stderr, out.stderr
    assert not (tmp_path / "cli").exists() and not (tmp_path / "given").exists()


def test_a_failed_first_attempt_does_not_block_the_corrected_command(tmp_path):
    """A run exists once it has a checkpoint: before that, any corrected command replaces the attempt
    (issue 22, item 10: a diverged run and a too short train split blocked the fix)."""
    config = tiny_config("alibi")
    config.train.steps = 2
    bad = tiny_config("alibi")
    bad.data.update(source="local", path=str(tmp_path / "no_such_folder"))
    with pytest.raises(ValueError):
        train(bad, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing left behind, not even the lock
    too_long = tiny_config("learned")
    too_long.posenc.learned.max_length = 8  # shorter than train.seq_len = 16: refused by the model
    with pytest.raises(ValueError, match="max_length"):
        train(too_long, tmp_path / "run")
    assert not (tmp_path / "run" / "config.json").exists()
    short = tmp_path / "short"
    short.mkdir()
    for split in ("train", "valid"):
        (short / f"{split}.txt").write_text("hi\n")
    too_short = tiny_config("alibi")
    too_short.data.update(source="local", path=str(short))
    with pytest.raises(ValueError, match=r"has 3 tokens, too few for train.seq_len=16; set --config.train.seq_len=1"):
        train(too_short, tmp_path / "run")
    diverging = tiny_config("alibi")
    diverging.train.update(lr=1e6, steps=4, warmup_steps=0, checkpoint_every=100)
    with pytest.raises(TrainingDiverged, match=r"training diverged: .* by step \d \(train.lr=1e\+06\); lower train.lr"
                                               r".*no checkpoint was written, so the corrected command starts"):
        train(diverging, tmp_path / "run")
    assert (tmp_path / "run" / "config.json").exists() and not RunDir(tmp_path / "run").has_checkpoint()
    assert train(config, tmp_path / "run")["done"]  # accepted in the same workdir
    steps = [json.loads(line)["step"] for line in RunDir(tmp_path / "run").metrics_path.read_text().splitlines()]
    assert steps == [1, 2]  # nothing of the diverged attempt is kept
    assert config_lib.load_config(tmp_path / "run" / "config.json").train.lr == config.train.lr


def test_a_read_only_workdir_is_one_line_naming_it(tmp_path, monkeypatch):
    """Issue 22, item 11: a 26-line OSError from the lock file (train, eval, passkey)."""
    from experiment.store import lock
    from tests.helpers import read_only_below
    read_only_below(monkeypatch, tmp_path)
    with pytest.raises(lock.NotWritable, match=rf"cannot write in {tmp_path} \(Read-only file system\): training "
                                               rf"and evaluation write .*\(cp -r {tmp_path} NEW\)"):
        with RunDir(tmp_path).locked("evaluation"):
            pass
    (tmp_path / ".lock").mkdir()
    monkeypatch.undo()  # writable again: the lock file itself is now the problem
    with pytest.raises(lock.NotWritable, match=r"\.lock cannot be opened as the run directory's lock file .* rm -r"):
        with RunDir(tmp_path).locked("evaluation"):
            pass


def test_a_truncated_latest_checkpoint_resumes_from_the_one_before(tmp_path, caplog):
    config = tiny_config("alibi")
    config.train.update(steps=4, checkpoint_every=2)
    train(config, tmp_path)
    run = RunDir(tmp_path)
    assert run.steps() == [2, 4] == sorted(checkpoints.manager_of(run).all_steps())  # the listing is orbax's
    biggest = max((p for p in (tmp_path / "checkpoints" / "4" / "params").rglob("*") if p.is_file()),
                  key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    (record,) = evaluate(tmp_path, [16], max_tokens=512)
    assert record["step"] == 2 and "step 4" in caplog.text and "cannot be read" in caplog.text
    config.train.steps = 6
    summary = train(config, tmp_path)
    assert summary["step"] == 6
    logged = [json.loads(l) for l in run.metrics_path.read_text().splitlines()]
    assert [m["step"] for m in logged] == [1, 2, 3, 4, 5, 6]  # 3 and 4 logged again after the damaged step was dropped
    shown = run_scalars(run.tensorboard_dir)  # TensorBoard: each step once, the values of the resumed run
    assert shown["train/loss"] == [(m["step"], float(np.float32(m["loss"]))) for m in logged]
    assert [step for step, _ in shown["eval/valid/ppl_L16_first512"]] == [2]


def test_the_steps_are_the_finished_step_folders_and_no_jax_is_needed_to_list_them(tmp_path):
    """What orbax counts as a checkpoint: a folder named by its step, not one still being written."""
    for name in ("2", "10", "0", "05", "4.orbax-checkpoint-tmp-17", "x"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    (tmp_path / "checkpoints" / "6").write_text("")  # a file, not a step
    run = RunDir(tmp_path, writer=True)
    assert run.steps() == [0, 2, 10] and run.latest_step() == 10 and run.has_checkpoint()
    assert RunDir(tmp_path / "elsewhere").latest_step() is None


def test_which_process_writes_is_asked_of_jax_only_where_it_is_loaded(monkeypatch):
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert run_lib.is_writer()  # no JAX: no job of several processes can exist
    monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(process_index=lambda: 1))
    assert not run_lib.is_writer() and not RunDir("anywhere").writer
    monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(process_index=lambda: 0))
    assert run_lib.is_writer()


def test_evaluating_after_more_training_replaces_stale_records():
    old = [{"split": "valid", "eval_length": l, "stride": l, "step": 2} for l in (32, 64)]
    new = [{"split": "valid", "eval_length": 32, "stride": 32, "step": 4}]
    kept, stale = records.merge(old, new)
    assert kept == new and stale == [old[1]]  # 32 replaced; 64 came from step 2, which is stale now
    same = records.merge(new, [{"split": "valid", "eval_length": 64, "stride": 64, "step": 4}])[0]
    assert sorted(r["eval_length"] for r in same) == [32, 64]


def test_training_without_a_terminal_logs_loss_lines_and_says_when_it_stops_early(tmp_path):
    out = run_entry("train.py", "--config", "configs/demo.py", "--workdir", str(tmp_path),
                    "--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.mlp_dim=64",
                    "--config.train.steps=4", "--config.train.log_every=1", "--config.train.batch_size=4",
                    "--config.train.seq_len=16", "--max_steps=2")
    assert out.returncode == 0, out.stderr
    loss_lines = [l for l in out.stderr.splitlines() if " loss " in l and "step " in l]
    assert len(loss_lines) == 2 and "step 2/4" in loss_lines[-1]
    assert "stopped at step 2 of 4" in out.stderr and "unfinished" in out.stderr


@pytest.mark.parametrize("args, expected", [
    (["--config.posenc.rope.pi_factor=2"], "has no effect: this run uses alibi, not rope"),
    (["--config.posenc.alibi.nosuch=1"], "positional scheme 'alibi' has no options"),
    (["--config.train.batch_size=-4"], "train.batch_size must be >= 1, got -4; a valid value: train.batch_size=32"),
    (["--config.train.steps=0"], "train.steps must be >= 1"),
])
def test_bad_training_options_are_refused_before_anything_is_written(tmp_path, args, expected):
    out = run_entry("train.py", "--config", "configs/demo.py", "--workdir", str(tmp_path / "run"), *args)
    assert out.returncode == 2 and expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run" / "config.json").exists()


def test_workdir_and_out_that_are_files_are_refused_in_one_line(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    out = run_entry("train.py", "--config", "configs/demo.py", "--workdir", str(file))
    assert out.returncode == 2 and "is a file; give a folder" in out.stderr and "Traceback" not in out.stderr
    out = run_entry("sweep.py", "--config", "configs/demo.py", "--workdir", str(tmp_path), "--train_lengths", "0")
    assert out.returncode == 2 and "flag --train_lengths=0: '0' is not a whole number >= 1" in out.stderr


def test_an_evaluation_override_for_a_scheme_the_run_does_not_use_is_refused():
    from experiment.evals.common import apply_overrides
    config = tiny_config("alibi")
    with pytest.raises(ValueError, match="has no effect: this run uses alibi, not rope"):
        apply_overrides(config, {"posenc.rope.pi_factor": "4"})
    wrapped = tiny_config("logn")  # logn wraps rope: rope's options act on the run
    assert apply_overrides(wrapped, {"posenc.rope.pi_factor": "4"}).posenc.rope.pi_factor == 4


def test_help_exits_0_listing_config_keys_and_schemes_and_a_bad_config_arg_is_one_line():
    out = run_entry("train.py", "--help")
    assert out.returncode == 0 and "train.batch_size=32" in out.stdout and "kerple_log" in out.stdout
    out = run_entry("train.py", "--config", "configs/demo.py:nosuch", "--workdir", "unused")
    assert out.returncode == 2 and "unknown positional scheme 'nosuch'" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_run_saved_before_an_option_existed_keeps_its_old_behaviour(tmp_path, monkeypatch):
    from experiment import config as config_lib
    config = tiny_config("sinusoidal")
    saved = config.to_dict()
    del saved["posenc"]["sinusoidal"]["layout"], saved["posenc"]["kerple_log"]["per_layer"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = config_lib.load_config(tmp_path / "config.json")
    assert loaded.posenc.sinusoidal.layout == "vaswani" and loaded.posenc.kerple_log.per_layer is True
    monkeypatch.setattr(RunDir, "has_checkpoint", lambda self: True)  # its config is fixed once it has one
    with pytest.raises(ValueError, match="posenc.sinusoidal.layout: 'vaswani' -> 'fairseq'"):
        RunDir(tmp_path).check_config(config_lib.resolve(config))


def test_ctrl_c_during_training_saves_a_checkpoint_and_the_steps_logged_since(tmp_path):
    import signal
    proc = subprocess.Popen(
        [sys.executable, "train.py", "--config", "configs/demo.py", "--workdir", str(tmp_path),
         "--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.mlp_dim=64",
         "--config.train.steps=100000", "--config.train.log_every=7", "--config.train.batch_size=4",
         "--config.train.seq_len=16", "--config.train.checkpoint_every=100000"],
        cwd=REPO, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # the first loss line: training is running
        if "step 7/" in line:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest
    (step,) = RunDir(tmp_path).steps()
    logged = [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[0] == 7 and logged[-1] == step and logged == sorted(set(logged)), rest
