"""RULER as an evaluation kind (experiment/evals/ruler.py): its records, what counts as already
scored, its flags; end to end (slow) on a tiny trained run through evaluate_kinds and the report.
The tasks themselves: tests/corpora/test_ruler.py."""

import pytest

from corpora import ruler as task_lib
from experiment.evals import kinds as kinds_lib
from experiment.evals import ruler
from experiment.store import records
from tests.conftest import run_entry, tiny_config


class _Built:
    def __init__(self, references, tokens):
        self.example = task_lib.Example("vt", "text", " prefix", tuple(references), 1)
        self.ids = [0] * tokens


def test_a_cells_record_holds_rulers_score_and_passes_the_record_check():
    built = [_Built(["ABCDE", "FGHIJ"], 990), _Built(["KLMNO", "PQRST"], 1000)]
    header = {"scheme": "rope", "train_length": 64, "step": 3, "method": "yarn"}
    spec = ruler.RulerSpec(tasks=("vt",), samples=2, seed=5)
    record = ruler.cell_record(task_lib.task("vt"), 1024, spec, built, ["abcde and fghij", "KLMNO\x01"], 12.34, header,
                               [5, 30])
    assert record["scores"] == [1.0, 0.5] and record["score"] == 0.75 and record["count"] == 2
    assert record["prompt_tokens"] == [990, 1000] and record["tokens_to_generate"] == 30 and record["seed"] == 5
    assert records.problem("ruler", [record]) is None
    assert "scores holds 1 values" in records.problem("ruler", [{**record, "scores": [1.0]}])
    assert record["answer_tokens"] == [5, 30]  # the second ran to vt's budget of 30
    assert "answer_tokens holds 1 values" in records.problem("ruler", [{**record, "answer_tokens": [5]}])
    old = {k: v for k, v in record.items() if k != "answer_tokens"}  # records written before the field
    assert records.problem("ruler", [old]) is None
    assert records.record_kind("ruler").key(record) != records.record_kind("ruler").key({**record, "template": "chat"})


def test_a_length_counts_as_scored_only_with_every_task_and_the_same_settings():
    header = {"step": 3, "method": "yarn"}
    spec = ruler.RulerSpec(tasks=("vt", "cwe"), samples=2, seed=5)
    rec = lambda task, length, **kw: {"task": task, "eval_length": length, "step": 3, "method": "yarn",  # noqa: E731
                                      "template": "base", "seed": 5, "count": 2, "score": 0.5, **kw}
    recs = [rec("vt", 1024), rec("cwe", 1024), rec("vt", 2048), rec("cwe", 2048, count=3), rec("vt", 4096),
            rec("cwe", 4096, method="dca")]
    assert list(ruler._recorded(recs, header, spec)) == [1024]
    assert ruler._recorded(recs, header, ruler.RulerSpec(tasks=("vt",), samples=2, seed=5, template="chat")) == {}
    assert kinds_lib.unscored(ruler.KIND, recs, header, spec, [1024, 2048]) == [2048]


def test_the_kind_is_registered_with_its_flags():
    registry = kinds_lib.registry()
    assert "ruler" in registry and registry["ruler"] is ruler.KIND
    acts_on = kinds_lib.acts_on(registry)
    assert {acts_on[n] for n in ("ruler_tasks", "samples", "ruler_template", "ruler_seed")} == {("ruler",)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from experiment.train import train
    tmp = tmp_path_factory.mktemp("ruler")
    data = tmp / "data"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.txt").write_text("The grass is green. The sky is blue. VAR ABC = 12345.\n" * 100)
    config = tiny_config("rope")
    config.data.update(dict(source="local", path=str(data)))
    config.train.steps = 2
    train(config, tmp / "run")
    return tmp / "run"


@pytest.mark.slow
def test_ruler_end_to_end_on_a_tiny_run_resumes_and_reports(trained, tmp_path):
    from experiment.report import ruler as report
    request = kinds_lib.Request(lengths=(1024,), options={"ruler_tasks": ("niah_single_1", "fwe"), "samples": 2},
                                methods=("direct", "yarn"), skip_done=True)
    out = kinds_lib.evaluate_kinds(trained, ("ruler",), request)["ruler"]
    assert {(r["task"], r["method"]) for r in out} == {(t, m) for t in ("niah_single_1", "fwe") for m in ("direct", "yarn")}
    for r in out:
        assert r["count"] == 2 and len(r["answers"]) == 2 and r["prompt_tokens"][1] <= 1024 - r["tokens_to_generate"]
        assert r["prompt_tokens"][0] >= 1024 - r["tokens_to_generate"] - 100  # within a noise line (bytes here)
    assert not any("same_as" in r for r in out)  # past the tiny run's window YaRN is scored on its own
    again = kinds_lib.evaluate_kinds(trained, ("ruler",), request)["ruler"]
    assert again == []  # --skip_done: every cell recorded
    paths = report.write([trained], tmp_path / "report")
    text = (tmp_path / "report" / "ruler.md").read_text()
    assert "Average score (percent) over the tasks fwe, niah_single_1" in text and "(n=2)" in text
    assert len(paths["heatmaps"]) == 2
    with pytest.raises(ValueError, match="has no chat_template.jinja"):
        kinds_lib.check_request(trained, ("ruler",), kinds_lib.Request(lengths=(1024,),
                                                                        options={"ruler_template": "chat"}))


@pytest.mark.slow
def test_an_unknown_task_is_one_line_and_exit_2(trained):
    result = run_entry("eval_extrapolate.py", "--workdir", str(trained), "--ruler", "--ruler_tasks", "niah,vt")
    assert result.returncode != 0 and "each name must be one of niah_single_1" in result.stderr
    result = run_entry("eval_extrapolate.py", "--workdir", str(trained), "--ruler", "--lengths", "200")
    assert result.returncode == 2 and "evaluate a longer length" in result.stderr.strip().splitlines()[-1]
