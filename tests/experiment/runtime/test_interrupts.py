"""Ctrl-C at any moment (experiment/runtime/interrupts.py): rc 130, a line that says what is saved,
nothing damaged. Each phase gets a real SIGINT, sent to the process from inside the call that
marks the phase (a wrapper patches that call to signal its own process), so the moment is exact;
start-up gets one from outside. Subprocesses cost seconds each: one runs by default, the rest
are marked slow."""
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from experiment.runtime import interrupts
from experiment.store.run import RunDir
from tests.conftest import REPO

TINY = ["--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.mlp_dim=64",
        "--config.train.batch_size=4", "--config.train.seq_len=16", "--config.train.log_every=1",
        "--config.eval.length_multipliers=1,2", "--config.eval.max_tokens=512"]

# Sends SIGNAL (SIGINT, SIGTERM) to its own process at the `nth` call of AT (module:attribute) made after
# ARMED_BY (module:attribute, or '-') has been called, then runs the entry point with the remaining arguments.
WRAPPER = """
import importlib, os, runpy, signal, sys
sent, at, nth, armed_by, entry, *args = sys.argv[1:]
def patch(path, before):
    module, _, attr = path.partition(":")
    owner = importlib.import_module(module)
    real = getattr(owner, attr)
    def wrapper(*a, **k):
        before()
        return real(*a, **k)
    setattr(owner, attr, wrapper)
state = {"armed": armed_by == "-", "calls": 0}
def fire():
    if state["armed"]:
        state["calls"] += 1
        if state["calls"] == int(nth):
            os.kill(os.getpid(), getattr(signal, sent))
patch(at, fire)
if armed_by != "-":
    patch(armed_by, lambda: state.update(armed=True))
sys.argv = [entry, *args]
runpy.run_path(entry, run_name="__main__")
"""


def sigint_at(at: str, entry: str, *args: str, nth: int = 1, armed_by: str = "-",
              sent: str = "SIGINT") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LX_TRACEBACK"}
    return subprocess.run([sys.executable, "-c", WRAPPER, sent, at, str(nth), armed_by, entry, *args], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=300)


def assert_stopped(out: subprocess.CompletedProcess, *needles: str) -> str:
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 130, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Fatal Python error" not in out.stderr, out.stderr[-3000:]
    for needle in needles:
        assert needle in last, last
    return last


def test_a_ctrl_c_is_held_to_the_next_safe_point_and_a_second_one_stops_at_once():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers belong to the main thread")
    before = signal.getsignal(signal.SIGINT)
    with interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)  # recorded only: no exception here
        assert interrupts.requested()
        with pytest.raises(interrupts.Interrupted, match="step 3 saved"):
            interrupts.check(lambda: "step 3 saved")
        with pytest.raises(KeyboardInterrupt):  # a second one (a library call: raised, the process lives)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    with interrupts.deferred():
        with pytest.raises(interrupts.Interrupted, match="while reading"):
            with interrupts.immediate("interrupted while reading"):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before and not interrupts.requested()


def test_a_ctrl_c_that_lands_in_a_garbage_collection_callback_still_stops_at_once(recwarn):
    """Issue 32: `Exception ignored in: <function _xla_gc_callback>` and 6 more lines, then the
    command went on: Python drops what a gc callback (JAX runs one at every collection) raises."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers belong to the main thread")
    landed = []

    def callback(phase, info):  # as JAX's _xla_gc_callback: Python code run by the collector
        if phase == "start" and not landed:
            landed.append(True)
            signal.raise_signal(signal.SIGINT)  # its handler runs here, inside the callback
            sum(range(1000))
    gc.callbacks.append(callback)
    try:
        with interrupts.deferred():
            with pytest.raises(interrupts.Interrupted, match="reading"):
                with interrupts.immediate("interrupted while reading"):
                    gc.collect()
                    time.sleep(1.0)  # the same Ctrl-C, delivered again once out of the callback
    finally:
        gc.callbacks.remove(callback)
    assert landed and not [w for w in recwarn if "Exception ignored" in str(w.message)]


ENTRY_POINTS = sorted(p.name for p in REPO.glob("*.py") if "app.run(" in p.read_text())


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_sets_its_start_up_handler_before_any_import(entry):
    """Ctrl-C while an entry point imports JAX: one line and rc 130 (selfcheck.py had no handler: a
    KeyboardInterrupt traceback from inside an import)."""
    source = (REPO / entry).read_text()
    code = source.split('"""', 2)[2].lstrip() if source.startswith('"""') else source
    assert code.startswith('if __name__ == "__main__":'), entry
    block = code.split("\n\n", 1)[0]
    assert "from experiment.runtime.early import catch_start_up_signals" in block, entry
    assert "catch_start_up_signals()" in block, entry


def test_the_start_up_handler_takes_both_signals_and_loads_nothing_but_the_standard_library():
    """What every entry point calls first (experiment/runtime/early.py): SIGINT and SIGTERM (issue 45)
    each end the process with one line and rc 128 + the signal; importing it loads no JAX or NumPy."""
    code = ("import sys, signal; from experiment.runtime.early import catch_start_up_signals; "
            "catch_start_up_signals(); "
            "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('jax', 'numpy', 'flax')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]
    for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        proc = subprocess.Popen([sys.executable, "-c", "import time; from experiment.runtime.early import "
                                 "catch_start_up_signals; catch_start_up_signals(); print('ready', flush=True); "
                                 "time.sleep(30)"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == code
        assert proc.stderr.read().strip() == "interrupted during start-up; nothing was written"


def test_ctrl_c_while_the_training_step_compiles_saves_nothing_and_says_so(tmp_path):
    """Issue 22, item 12: a segmentation fault after "checkpoint saved" (nothing was), or the run
    trained to the end. The SIGINT comes inside JAX's lowering of the training step."""
    out = sigint_at("jax._src.interpreters.mlir:lower_jaxpr_to_module", "train.py", "--config", "configs/demo.py",
                    *TINY, "--config.train.steps=3", "--workdir", str(tmp_path),
                    armed_by="experiment.train.loop:make_train_step")
    assert_stopped(out, "interrupted while compiling the training step; no checkpoint exists yet")
    assert not RunDir(tmp_path).has_checkpoint() and not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_ctrl_c_during_start_up_writes_nothing(tmp_path):
    proc = subprocess.Popen([sys.executable, "train.py", "--config", "configs/demo.py", *TINY,
                             "--workdir", str(tmp_path / "run")], cwd=REPO, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # importing JAX
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 130 and err.strip().splitlines()[-1] == (
        "interrupted during start-up; nothing was written"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_ctrl_c_during_a_checkpoint_write_finishes_it_and_the_run_resumes(tmp_path):
    args = ["train.py", "--config", "configs/demo.py", *TINY, "--config.train.steps=4",
            "--config.train.checkpoint_every=2", "--workdir", str(tmp_path)]
    out = sigint_at("experiment.store.checkpoints:save", *args)
    assert_stopped(out, "interrupted at step 2 of 4; checkpoint saved at step 2: the same command resumes")
    assert sorted(RunDir(tmp_path).steps()) == [2]
    resumed = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resuming" in resumed.stderr, resumed.stderr[-2000:]
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    final = sigint_at("experiment.store.checkpoints:save", *args[:-2], "--config.train.steps=6", "--workdir",
                      str(tmp_path))  # the last checkpoint (step 6): training is complete, the evaluation not run
    assert_stopped(final, "interrupted at step 6 of 6; checkpoint saved at step 6: training is complete")
    assert {r["step"] for r in RunDir(tmp_path).records("perplexity")} == {4}  # step 6 not evaluated yet


@pytest.mark.slow
def test_ctrl_c_during_evaluation_keeps_the_lengths_scored(tmp_path):
    subprocess.run([sys.executable, "train.py", "--config", "configs/demo.py", *TINY, "--config.train.steps=3",
                    "--max_steps=2", "--workdir", str(tmp_path)], cwd=REPO, check=True, capture_output=True)
    out = sigint_at("experiment.evals.perplexity:_score_length", "eval_extrapolate.py", "--workdir", str(tmp_path),
                    "--lengths", "16,32,64", nth=2)
    assert_stopped(out, "interrupted while scoring perplexity at L=32; the 1 perplexity record(s) this command wrote "
                        "(as trained L=16) are kept in")
    assert [r["eval_length"] for r in RunDir(tmp_path).records("perplexity")] == [16]
    out = sigint_at("experiment.evals.perplexity:_score_length", "eval_extrapolate.py", "--workdir", str(tmp_path),
                    "--lengths", "32,64", "--methods", "direct,lm_infinite", nth=3, sent="SIGTERM")  # issue 67, case 8
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 143 and "interrupted while scoring perplexity at L=32; the 2 perplexity record(s) " \
        "this command wrote (direct L=32, direct L=64) are kept in" in last, out.stderr[-3000:]
    out = sigint_at("experiment.evals.passkey:_evaluate_passkey", "eval_extrapolate.py", "--workdir", str(tmp_path),
                    "--passkey", "--lengths", "32,64", "--passkey_per_cell", "1")
    assert_stopped(out, "interrupted while scoring passkey at L=32; no passkey record of this evaluation")


@pytest.mark.slow
def test_ctrl_c_during_a_sweep_says_which_runs_are_done_and_the_same_command_goes_on(tmp_path):
    args = ["sweep.py", "--config", "configs/demo.py", *TINY, "--config.train.steps=2", "--schemes", "alibi,rope",
            "--workdir", str(tmp_path)]
    out = sigint_at("experiment.train.loop:_train_loop", *args, nth=2)
    assert_stopped(out, f"sweep {tmp_path}: 1 of 2 runs done; in rope_L16: interrupted")
    again = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "alibi_L16: trained to step 2 already, not trained again" in again.stderr, again.stderr[-2000:]
    assert "rope: 0.0M parameters" in again.stderr and "alibi: 0.0M parameters" not in again.stderr


def test_the_ctrl_c_line_of_an_evaluation_counts_every_record_the_command_wrote(tmp_path):
    """Issue 67, case 8: SIGTERM in the third method said "no perplexity record of this evaluation was
    written" although the first two methods' records were written and kept."""
    from types import SimpleNamespace
    from experiment.evals import common
    run = SimpleNamespace(writer=True, path=tmp_path, add_records=lambda kind, records: None,
                          records_path=lambda kind: tmp_path / "eval" / f"{kind}.json")
    first, third = SimpleNamespace(run=run, method="direct"), SimpleNamespace(run=run, method="dca")
    common.Scoring.write(first, "perplexity", [{"eval_length": 16, "method": "direct"}, {"eval_length": 32}])
    line = common.Scoring.interrupted(third, "perplexity", [], 16)
    assert line == (f"interrupted while scoring perplexity at L=16; the 2 perplexity record(s) this command wrote "
                    f"(direct L=16, direct L=32) are kept in {tmp_path / 'eval' / 'perplexity.json'}: the same "
                    f"command evaluates again")
    assert "no passkey record of this evaluation" in common.Scoring.interrupted(third, "passkey", [], 16)


def test_sigterm_is_held_to_the_next_safe_point_like_a_ctrl_c_and_ends_with_143():
    """Issue 45, item 3: SIGTERM (kill, timeout, SLURM, docker stop) ended training at once, rc 143 and no
    message, losing the steps since the last checkpoint."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers belong to the main thread")
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.deferred():
        os.kill(os.getpid(), signal.SIGTERM)  # recorded only
        assert interrupts.requested() and interrupts.exit_code() == 143
        with pytest.raises(interrupts.Interrupted, match="step 3 saved"):
            interrupts.check(lambda: "step 3 saved")
    assert signal.getsignal(signal.SIGTERM) is before and interrupts.exit_code() == 130


def test_a_command_stopped_by_sigterm_says_what_is_saved_and_exits_143(monkeypatch, capsys):
    import experiment.cli as cli
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers belong to the main thread")
    monkeypatch.setattr(cli, "start_runtime", lambda *a: None)

    def work():
        os.kill(os.getpid(), signal.SIGTERM)  # recorded: the work goes on to its safe point
        interrupts.check("interrupted at step 7 of 9; checkpoint saved at step 7")
    with pytest.raises(SystemExit) as exit_:
        cli.run_cleanly(work)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 143 and err[-1] == "interrupted at step 7 of 9; checkpoint saved at step 7", err


def test_a_second_sigterm_stops_at_once_with_143():
    script = ("import os, signal, time\nfrom experiment.runtime import interrupts\n"
              "with interrupts.deferred(exit_on_second=True):\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(0.1)\n    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(5)\nprint('not stopped')\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stderr.splitlines() if line]
    assert out.returncode == 143 and "not stopped" not in out.stdout, out
    assert lines[0] == ("SIGTERM: stopping at the next safe point (after the current step, "
                                          "compilation or write); SIGTERM again to stop at once")
    assert lines[-1].startswith("second SIGTERM: stopped at once") and len(lines) == 2, out.stderr


@pytest.mark.slow  # trains (a tiny run; tests/experiment/train/test_loop.py sends one in-process by default)
def test_sigterm_during_training_saves_the_steps_done_and_exits_143(tmp_path):
    """The SIGTERM comes while the batch of step 1 is read (checkpoints every 1000 steps): the run stops
    after that step with a checkpoint at step 2, nothing lost."""
    out = sigint_at("corpora:train_batch", "train.py", "--config", "configs/demo.py", *TINY,
                    "--config.train.steps=5", "--config.train.checkpoint_every=1000", "--workdir", str(tmp_path),
                    nth=3, sent="SIGTERM")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 143 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert last == "interrupted at step 2 of 5; checkpoint saved at step 2: the same command resumes from it", last
    assert "SIGTERM: stopping at the next safe point" in out.stderr
    assert sorted(RunDir(tmp_path).steps()) == [2]
