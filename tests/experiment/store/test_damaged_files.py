"""Damaged files inside a run directory, as reports read them (experiment/store/run.py, files.py,
records.py): each one refused by name, with what is wrong and the command that repairs it; a
damaged line of metrics.jsonl dropped with a warning that names it."""
import json
import logging
import shlex

import pytest

from experiment.report import write_report
from experiment.store.run import RunDir, RunError
from tests.experiment.report.synthetic import full_run

E, P, A = "eval/extrapolation.json", "eval/passkey.json", "eval/attention.json"


def _edit(rel: str, change):
    def damage(path):
        data = json.loads((path / rel).read_text())
        change(data)
        (path / rel).write_text(json.dumps(data))
    return damage


def _write(rel: str, text: str):
    return lambda path: (path / rel).write_text(text)


RECORDS = {  # case: (file, kind, damage, what the message says is wrong)
    "not JSON": (E, "perplexity", _write(E, "[{"), "Expecting property name"),
    "an object": (E, "perplexity", _write(E, "{}"), "holds a JSON object, not a list of records"),
    "a number": (E, "perplexity", _write(E, "[1]"), "record 0 is a JSON number, not an object"),
    "no ppl": (E, "perplexity", _edit(E, lambda r: r[1].pop("ppl")), "record 1 has no 'ppl'"),
    "ppl a string": (E, "perplexity", _edit(E, lambda r: r[0].update(ppl="x")), "ppl = 'x' is not a number > 0"),
    "ppl negative": (E, "perplexity", _edit(E, lambda r: r[0].update(ppl=-1.0)), "ppl = -1.0 is not a number > 0"),
    "length a string": (E, "perplexity", _edit(E, lambda r: r[0].update(eval_length="64")),
                        "eval_length = '64' is not a positive integer"),
    "overrides a string": (E, "perplexity", _edit(E, lambda r: r[0].update(overrides="x")),
                           "overrides = 'x' is not an object"),
    "position rows short": (E, "perplexity", _edit(E, lambda r: r[0].update(position_nll=[[0, 1]])),
                            "is not a list of [first, last, loss] rows"),
    "a folder": (E, "perplexity", lambda p: ((p / E).unlink(), (p / E).mkdir()), "Is a directory"),
    "passkey count 0": (P, "passkey", _edit(P, lambda r: r[2].update(count=0)), "record 2: count = 0 is not a positive"),
    "passkey accuracy 2": (P, "passkey", _edit(P, lambda r: r[0].update(accuracy=2)), "accuracy = 2 is not a number from 0 to 1"),
    "attention shape": (A, "attention", _edit(A, lambda r: r[0].update(heads=3)),
                        "mean_distance is not layers x heads x position bins = 2 x 3 x 5"),
    "attention no bins": (A, "attention", _edit(A, lambda r: r[0].pop("positions")), "record 0 has no 'positions'"),
}


@pytest.mark.parametrize("case", list(RECORDS))
def test_damaged_records_are_refused_by_name_with_the_command_that_repairs_them(tmp_path, case):
    rel, kind, damage, problem = RECORDS[case]
    run = full_run(tmp_path, "run")
    damage(run)
    flag = {"perplexity": "", "passkey": " --passkey", "attention": " --attention"}[kind]
    path = shlex.quote(str(run / rel))
    with pytest.raises(RunError) as error:
        RunDir(run).records(kind)
    message = str(error.value)
    assert message.startswith(f"{run / rel} is damaged (") and problem in message
    assert message.endswith(f"; delete it and evaluate again: rm {'-r ' if case == 'a folder' else ''}{path}; "
                            f"python eval_extrapolate.py --workdir {shlex.quote(str(run))}{flag}")


CONFIGS = {  # case: (damage, what the message says is wrong)
    "not JSON": (_write("config.json", "{"), "Expecting property name"),
    "a list": (_write("config.json", "[]"), "a config is a mapping of sections, found a list"),
    "no train section": (_edit("config.json", lambda c: c.pop("train")), "no train section"),
    "L a string": (_edit("config.json", lambda c: c["train"].update(seq_len="abc")),
                   "train.seq_len = 'abc' is not an integer"),
    "unknown scheme": (_edit("config.json", lambda c: c["posenc"].update(name="nosuch")),
                       "unknown positional scheme 'nosuch'"),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_a_damaged_config_is_refused_by_name(tmp_path, case):
    damage, problem = CONFIGS[case]
    run = full_run(tmp_path, "run")
    damage(run)
    with pytest.raises(RunError) as error:
        RunDir(run).load_config()
    message = str(error.value)
    assert message.startswith(f"{run / 'config.json'} is damaged (") and problem in message
    assert "train.py" in message
    with pytest.raises(RunError, match="config.json is damaged"):  # what report.py prints in one line
        write_report([run], tmp_path / "report")


@pytest.mark.parametrize("text, problem", [("{", "Expecting property name"), ("[]", "expected {workdir, step"),
                                           ('{"step": 3}', "expected {workdir, step"),
                                           ('{"workdir": "b"}', "expected {workdir, step")])
def test_a_damaged_origin_is_refused_by_name_with_what_to_do(tmp_path, text, problem):
    run = full_run(tmp_path, "run")
    (run / "init_from.json").write_text(text)
    with pytest.raises(RunError) as error:
        RunDir(run).origin()
    message = str(error.value)
    assert message.startswith(f"{run / 'init_from.json'} is damaged (") and problem in message
    assert "delete it (rm " in message


def test_damaged_metrics_lines_are_dropped_by_name_on_resume(tmp_path, caplog):
    run = RunDir(full_run(tmp_path, "run"))
    lines = [json.dumps({"step": 1, "loss": 3.0}), "[1, 2]", json.dumps({"step": "2"}), json.dumps({"step": 2}),
             json.dumps({"step": 3}), '{"step": 4, "lo']  # the last line: cut short by a crash
    run.metrics_path.write_text("\n".join(lines))
    with caplog.at_level(logging.WARNING):
        run.truncate_metrics(2)
    assert run.metrics_path.read_text().splitlines() == [lines[0], lines[3]]
    assert "dropped 2 damaged line(s)" in caplog.text and "line 2, 3" in caplog.text
