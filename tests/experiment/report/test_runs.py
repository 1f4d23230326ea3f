"""What a report's runs are and how they are named (experiment/report/runs.py): advice for a
sweep's root that works as written, and names that tell runs apart in any script."""
import shlex

import pytest

from experiment.report import write_report
from experiment.report.runs import file_stems, refuse_folders_of_runs
from experiment.store.run import RunError
from tests.experiment.report.synthetic import fake_run


def test_a_sweep_root_given_for_its_runs_is_answered_with_a_command_that_works_as_written(tmp_path):
    """Issue 22, item 15 advised evaluating the root; issue 32: the advice `report.py ROOT/*` then
    took the sweep's own report/ folder, which failed."""
    root = tmp_path / "sweep"
    runs = [fake_run(root, scheme, 64, "/data/c", {64: 5.0}, name=f"{scheme}_L64") for scheme in ("alibi", "rope")]
    write_report(runs, root / "report")  # as sweep.py leaves it
    with pytest.raises(RunError) as error:
        refuse_folders_of_runs([root], "out")
    message = str(error.value)
    assert message.endswith(f"python report.py {runs[0]} {runs[1]} --out out") and "/*" not in message
    command = shlex.split(message.split("give the runs, ", 1)[1])  # what the user would run
    assert command[2:4] == [str(r) for r in runs] and not any("report" in a for a in command[2:4])
    refuse_folders_of_runs(runs, "out")  # the runs themselves are fine
    with pytest.raises(RunError, match=rf"{root / 'report'} is a folder report.py wrote, not a run: leave it out, "
                                       rf"python report.py {runs[0]} {runs[1]} --out out"):
        refuse_folders_of_runs([*runs, root / "report"], "out")  # what ROOT/* gives


def test_run_files_are_named_in_the_script_of_the_run_names():
    assert file_stems(["A/alibi_L64", "B/alibi_L64"]) == ["A_alibi_L64", "B_alibi_L64"]
    assert file_stems(["运行/甲", "运行/乙"]) == ["运行_甲", "运行_乙"]  # was run, run_2
    assert file_stems(["a b", "a:b"]) == ["a_b", "a_b_2"]
