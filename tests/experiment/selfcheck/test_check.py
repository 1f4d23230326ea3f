"""The self-check command (experiment/selfcheck/check.py, selfcheck.py) in its short mode on CPU: a row per
attention path with errors against the float32 reference, throughput, planned memory and auto's pick,
written as JSON and markdown; a wrong path makes the exit status 1; the rule that judges a row."""
import json

import numpy as np
import pytest

from experiment.selfcheck import check as selfcheck, measure


def test_the_short_table_on_cpu(tmp_path, monkeypatch):
    """The short plan at one length that is no multiple of any tile, on auto's path there and the
    Pallas kernel (in the interpreter, errors only); every path: tests/experiment/selfcheck/test_check.py's
    slow test."""
    monkeypatch.setattr(measure, "PATHS", ("blockwise", "pallas"))
    plan = selfcheck.make_plan(short=True, schemes="alibi", lengths="40")
    assert plan.dtype == "float32" and plan.model["attention_block"] == 16 and plan.mode == "short"
    lines = []
    result, status = selfcheck.run(plan, tmp_path, say=lines.append)
    assert status == 0 and result["passed"]
    blockwise, kernel = result["rows"]
    assert (blockwise["path"], kernel["path"]) == ("blockwise", "pallas")
    for row in (blockwise, kernel):  # in float32 on CPU both within ~1e-6 of the reference
        assert row["status"] == "ok" and row["forward_error"] < 1e-5 and row["gradient_error"] < 1e-5
    assert blockwise["auto"] == "train, eval"  # 40 tokens > 2 tiles of 16
    assert blockwise["train_tokens_per_s"] > 0 and blockwise["eval_tokens_per_s"] > 0
    assert blockwise["train_mb"] > blockwise["eval_mb"] > 0  # the step holds optimizer state too
    assert kernel["note"] == "interpreted" and "train_tokens_per_s" not in kernel
    saved = json.loads((tmp_path / "selfcheck_cpu_short.json").read_text())
    assert saved["rows"] == result["rows"] and saved["plan"]["lengths"] == [40]
    table = (tmp_path / "selfcheck_cpu_short.md").read_text()
    assert "**PASS**" in table and table.count("\n| `alibi` | 40 |") == 2
    assert len(lines) == 4 and lines[0].startswith("1 (scheme, length) cells x 2 paths") and lines[-1].startswith("wrote ")
    paper = selfcheck.make_plan(shape="paper")  # the ALiBi paper's heads: 8 of 128
    assert paper.model["num_heads"] == 8 and paper.head_dim == 128 and paper.lengths == (512, 4096, 16384)


@pytest.mark.slow  # ~1-5 minutes on 2 cores: every path of the short plan, and the entry point
def test_the_short_mode_of_the_command(tmp_path):
    from tests.conftest import run_entry
    result = run_entry("selfcheck.py", "--short", f"--out={tmp_path}", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / "selfcheck_cpu_short.json").read_text())
    assert len(saved["rows"]) == 2 * 2 * 6 and saved["passed"]  # 2 schemes x 2 lengths x 6 paths
    assert {r["path"] for r in saved["rows"] if r["auto"]} == {"triangular", "blockwise"}
    # cpu_flash computes q . k alone, and both schemes of the short plan add a bias: n/a, with the reason
    flash = [r for r in saved["rows"] if r["path"] == "cpu_flash"]
    assert all(r["status"] == "n/a" and "use auto, blockwise or dense" in r["note"] for r in flash)
    rest = [r for r in saved["rows"] if r["path"] != "cpu_flash"]
    assert all(r["status"] == "ok" and r["gradient_error"] < 1e-5 for r in rest)
    assert all("train_tokens_per_s" in r for r in rest if r["path"] != "pallas")


def test_a_wrong_path_fails_the_run(tmp_path, monkeypatch):
    """A path computing something else (here blockwise, made to attend one key too far back) is WRONG,
    in the table and in the exit status."""
    real = measure.path_function

    def wrong_blockwise(path, plan, launch=None):
        attend = real(path, plan, launch)
        if path != "blockwise":
            return attend
        return lambda q, k, v, qp, kp, s: attend(q, k, v, qp, kp - 1, s)
    monkeypatch.setattr(measure, "path_function", wrong_blockwise)
    monkeypatch.setattr(measure, "timed", lambda *args: {})
    monkeypatch.setattr(measure, "PATHS", ("dense", "blockwise"))
    plan = selfcheck.make_plan(short=True, schemes="t5", lengths="24")
    result, status = selfcheck.run(plan, tmp_path, say=lambda line: None)
    assert status == 1 and result["wrong"] == 1
    assert [r["status"] for r in result["rows"]] == ["ok", "WRONG"]
    assert "**FAIL**" in (tmp_path / "selfcheck_cpu_short.md").read_text()


def test_a_refused_kernel_is_named_with_why_and_makes_the_status_3(tmp_path, monkeypatch):
    """A kernel the device check refuses (here: the interpreter standing in for a GPU whose check
    failed) is a row marked refused, named in the closing line with the reason, exit status 3."""
    from models.attention import choice, pallas, verify
    monkeypatch.setattr(pallas, "interpreted", lambda: False)
    monkeypatch.setattr(choice, "device_verdict", lambda *args: verify.Verdict(False, "mismatch", "dq wrong (planted)"))
    from models.attention import tuning
    monkeypatch.setattr(tuning, "device_launch", lambda *args: pallas.Launch(block=16, interpret=True))
    monkeypatch.setattr(measure, "timed", lambda *args: {})
    monkeypatch.setattr(measure, "PATHS", ("dense", "pallas"))
    lines = []
    result, status = selfcheck.run(selfcheck.make_plan(short=True, schemes="alibi", lengths="24"), tmp_path,
                                   say=lines.append)
    assert status == 3 and result["refused"] == 1 and result["complete"]
    assert [r["status"] for r in result["rows"]] == ["ok", "refused"]
    assert "refused here (XLA's paths used instead): alibi L=24 pallas: dq wrong (planted)" in lines[-1]


def test_rows_are_written_as_they_finish_so_a_crash_keeps_them(tmp_path, monkeypatch):
    real, calls = measure.rows_for, []

    def crash_on_the_second(plan, scheme, length):
        calls.append(length)
        if len(calls) == 2:
            raise MemoryError("killed")
        return real(plan, scheme, length)
    monkeypatch.setattr(measure, "rows_for", crash_on_the_second)
    monkeypatch.setattr(measure, "timed", lambda *args: {})
    monkeypatch.setattr(measure, "PATHS", ("dense",))
    with pytest.raises(MemoryError):
        selfcheck.run(selfcheck.make_plan(short=True, schemes="alibi", lengths="24,40"), tmp_path, say=lambda x: None)
    saved = json.loads((tmp_path / "selfcheck_cpu_short.json").read_text())
    assert not saved["complete"] and [(r["length"], r["status"]) for r in saved["rows"]] == [(24, "ok")]
    assert "| `alibi` | 24 |" in (tmp_path / "selfcheck_cpu_short.md").read_text()


def test_rows_are_judged_against_xla_paths_within_floor_and_cap():
    rows = [dict(path="dense", status="ok", forward_error=0.004, gradient_error=0.005),
            dict(path="blockwise", status="ok", forward_error=0.006, gradient_error=0.009),
            dict(path="pallas", status="ok", forward_error=0.011, gradient_error=0.0269),
            dict(path="fused", status="n/a"),
            dict(path="pallas", status="refused", forward_error=0.5, gradient_error=0.5)]
    measure.judge(rows, "bfloat16")  # bounds: 3 x the largest of XLA's (verify.XLA_FACTOR), 0.006 and 0.009
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "n/a", "refused"]
    assert rows[0]["forward_bound"] == pytest.approx(0.018) and rows[0]["gradient_bound"] == pytest.approx(0.027)
    rows[2]["gradient_error"] = 0.0271
    measure.judge(rows, "bfloat16")
    assert rows[2]["status"] == "WRONG"
    far_off = [dict(path="dense", status="ok", forward_error=0.2, gradient_error=0.001)]
    measure.judge(far_off, "bfloat16")  # XLA's own paths are held to the cap
    assert far_off[0]["status"] == "WRONG" and far_off[0]["forward_bound"] == pytest.approx(0.1)
    alone = [dict(path="pallas", status="ok", forward_error=0.0, gradient_error=np.float64(0.004))]
    measure.judge(alone, "float32")  # no XLA path ran: the cap
    assert alone[0]["status"] == "ok" and alone[0]["gradient_bound"] == pytest.approx(0.01)


@pytest.mark.parametrize("kwargs,expected", [
    (dict(lengths="abc"), "flag --lengths=abc: 'abc' is not a whole number >= 1 (e.g. --lengths=512,4096)"),
    (dict(lengths="-5"), "flag --lengths=-5: '-5' is not a whole number >= 1"),
    (dict(memory_gb=-1.0), "flag --memory_gb=-1: must be >= 0 (0 = the default"),
], ids=["abc", "negative length", "negative memory"])
def test_bad_lengths_and_memory_are_refused_naming_the_flag(kwargs, expected):
    """Issue 32: --lengths abc / -5 named no flag; --memory_gb=-1 skipped every row and reported PASS."""
    with pytest.raises(ValueError) as error:
        selfcheck.make_plan(short=True, **kwargs)
    assert str(error.value).startswith(expected), str(error.value)
    assert selfcheck.make_plan(short=True, lengths=[24, 40], memory_gb=0.5).lengths == (24, 40)


def test_the_command_refuses_a_negative_memory_limit_as_it_parses_it():
    from tests.conftest import run_entry
    result = run_entry("selfcheck.py", "--short", "--memory_gb=-1", "--lengths=24")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "error: flag --memory_gb=-1: '-1' is not a number >= 0 (0 = the default" in result.stderr


def test_the_time_budget_runs_shortest_first_names_the_cells_left_and_estimates_from_an_earlier_run(tmp_path,
                                                                                                   monkeypatch):
    """Issue 33: within --minutes by default (cells the budget would overrun are named, not run; exit
    status unaffected), and an estimate before the first cell from an earlier run's cell times."""
    clock = [0.0]
    monkeypatch.setattr(selfcheck.time, "time", lambda: clock[0])

    def rows_taking(plan, scheme, length):  # a cell takes length / 4 seconds of the fake clock
        clock[0] += length / 4
        return [{"scheme": scheme, "length": length, "path": "dense", "auto": "", "status": "ok", "note": "",
                 "forward_error": 0.0, "gradient_error": 0.0}]
    monkeypatch.setattr(measure, "rows_for", rows_taking)
    monkeypatch.setattr(measure, "PATHS", ("dense",))
    plan = selfcheck.make_plan(short=True, schemes="alibi,t5", lengths="240,24", minutes=1)  # 60 s
    lines = []
    result, status = selfcheck.run(plan, tmp_path, say=lines.append)
    assert "no earlier run here to estimate from" in lines[0] and "--minutes=1" in lines[0]
    # 24 (6 s), 24 (6 s), then 240 would take (240 / 24)^2 x 6 s = 600 s: past 60 s, so neither 240 runs
    assert [(r["scheme"], r["length"], r["status"]) for r in result["rows"]] == [
        ("alibi", 24, "ok"), ("t5", 24, "ok"), ("alibi", 240, "not run"), ("t5", 240, "not run")]
    assert status == 0 and "2 cell(s) not run (--minutes=0 runs every cell)" in lines[-2]
    assert lines[-1].endswith("not run within --minutes (--minutes=0 runs every cell): alibi L=240, t5 L=240")
    assert [c["seconds"] for c in result["cell_seconds"]] == [6.0, 6.0]

    everything = selfcheck.make_plan(short=True, schemes="alibi,t5", lengths="24,240", minutes=0)
    result, status = selfcheck.run(everything, tmp_path, say=lines.append)
    assert [r["status"] for r in result["rows"]] == ["ok"] * 4
    lines.clear()
    selfcheck.run(everything, tmp_path, say=lines.append)  # the cell times of the run before
    assert lines[0].endswith("about 2 min by an earlier run on this device; every cell is run (--minutes=0)")
    with pytest.raises(ValueError, match="flag --minutes=-1: must be"):
        selfcheck.make_plan(short=True, minutes=-1)


def test_a_self_check_that_checked_nothing_does_not_pass(tmp_path):
    """Issue 45: --memory_gb=0.000001 skipped every row and wrote PASS with exit status 0; a run that
    checked no row fails, with exit status 4 and the reason in its closing line and table."""
    plan = selfcheck.make_plan(short=True, schemes="alibi", lengths="24", memory_gb=0.000001)
    lines = []
    result, status = selfcheck.run(plan, tmp_path, say=lines.append)
    assert status == 4 and not result["passed"] and result["checked"] == 0 and result["wrong"] == 0
    assert {r["status"] for r in result["rows"]} <= {"skipped", "n/a"}
    assert len(result["rows"]) >= 5  # one row per attention path, every one of them skipped here
    assert f"nothing was checked: all {len(result['rows'])} row(s) skipped, n/a or not run" in lines[-1]
    assert "**FAIL**: nothing was checked" in (tmp_path / "selfcheck_cpu_short.md").read_text()
