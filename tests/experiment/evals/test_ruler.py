"""RULER as an evaluation kind (experiment/evals/ruler.py): its records, what counts as already
scored, its flags; end to end (slow) on a tiny trained run through evaluate_kinds and the report.
The tasks themselves: tests/corpora/test_ruler.py."""

import json

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


def train_tiny_run(folder):
    """A tiny RoPE run trained 2 steps on RULER's noise sentences (folder/data, folder/run): what the
    RULER tests evaluate."""
    from experiment.train import train
    data = folder / "data"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.txt").write_text("The grass is green. The sky is blue. VAR ABC = 12345.\n" * 100)
    config = tiny_config("rope")
    config.data.update(dict(source="local", path=str(data)))
    config.train.steps = 2
    train(config, folder / "run")
    return folder / "run"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("ruler"))


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


def test_needle_distances_read_tokens_or_multiples_of_the_window_and_keep_their_cells_apart():
    assert ruler.distance_tokens("12000", 8192) == 12000 and ruler.distance_tokens("1.25w", 8192) == 10240
    for bad in ("far", "-1w", "0"):
        with pytest.raises(ValueError, match="--needle_distances"):
            ruler.distance_tokens(bad, 8192)
    header = {"step": 3, "method": "yarn"}
    spec = ruler.RulerSpec(tasks=("niah_single_1",), samples=4, seed=5, distances=("1.25w",), questions=2)
    rec = {"task": "niah_single_1", "eval_length": 1024, "step": 3, "method": "yarn", "template": "base", "seed": 5,
           "count": 4, "score": 0.5}
    designed = {**rec, "placement": "designed", "needle_distances": ["1.25w"], "questions_per_prefill": 2}
    assert list(ruler._recorded([rec], header, spec)) == [] and list(ruler._recorded([designed], header, spec)) == [1024]
    assert list(ruler._recorded([designed], header, ruler.RulerSpec(tasks=("niah_single_1",), samples=4, seed=5))) == []
    key = records.record_kind("ruler").key
    assert key(rec) != key(designed) != key({**designed, "questions_per_prefill": 1})


@pytest.mark.slow
def test_needles_by_distance_end_to_end_one_prefill_for_two_questions(trained, tmp_path):
    """niah_single_1 at 1024 with needles 300 and 700 tokens back, 2 questions a prefill, 4 questions,
    two methods: records with each question's context and measured distance, the report's band and pairs
    tables; bad requests refused before anything runs."""
    from experiment.report import ruler as report
    options = {"ruler_tasks": ("niah_single_1",), "samples": 4, "needle_distances": ("300", "700"),
               "questions_per_prefill": 2}
    request = kinds_lib.Request(lengths=(1024,), options=options, methods=("direct", "yarn"), skip_done=True)
    out = kinds_lib.evaluate_kinds(trained, ("ruler",), request)["ruler"]
    assert len(out) == 2
    for r in out:
        assert r["placement"] == "designed" and r["questions_per_prefill"] == 2 and r["contexts"] == [0, 0, 1, 1]
        assert r["targets"] == [300, 700, 300, 700] and r["needle_distance_tokens"] == [300, 700]
        assert all(abs(d - t) <= 200 for d, t in zip(r["distances"], r["targets"]))  # a noise line: ~90 bytes
        assert records.problem("ruler", [r]) is None
    assert kinds_lib.evaluate_kinds(trained, ("ruler",), request)["ruler"] == []  # --skip_done
    report.write([trained], tmp_path / "report")
    text = (tmp_path / "report" / "ruler.md").read_text()
    assert "Needles placed by distance" in text and "| direct | yarn |" in text and "sign test over 2 groups" in text
    for bad, match in (({"questions_per_prefill": 2, "needle_distances": ()}, "give\n?.*--needle_distances"),
                       ({"ruler_tasks": ("vt",)}, "vt cannot place needles by distance"),
                       ({"samples": 3}, "multiple of\n?.*--questions_per_prefill=2"),
                       ({"needle_distances": ("300", "2000")}, "must lie in"),
                       ({"haystack_stretches": "disjoint"}, "book-haystack task")):
        with pytest.raises(ValueError, match=match):
            kinds_lib.check_request(trained, ("ruler",), kinds_lib.Request(lengths=(1024,), options={**options, **bad}))


@pytest.mark.slow
def test_a_designed_cell_asked_with_more_questions_keeps_the_ones_recorded(trained, tmp_path, monkeypatch):
    """Context j is the same whatever else is asked, so a cell of 2 questions extended to 4 keeps the 2
    recorded (scores, answers, seconds) and asks only the 2 new ones; the record says so and replaces
    the smaller one."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    options = {"ruler_tasks": ("niah_single_1",), "samples": 2, "needle_distances": ("300", "700")}
    first = kinds_lib.evaluate_kinds(run, ("ruler",), kinds_lib.Request(lengths=(1024,), options=options))["ruler"][0]
    asked = []
    generate = ruler.generate
    monkeypatch.setattr(ruler, "generate", lambda model, batch, *a, **k: asked.extend(batch) or generate(model, batch, *a, **k))
    request = kinds_lib.Request(lengths=(1024,), options={**options, "samples": 4}, skip_done=True)
    (more,) = kinds_lib.evaluate_kinds(run, ("ruler",), request)["ruler"]
    assert len(asked) == 2 and more["count"] == 4 and more["extended_from"] == 2
    assert more["scores"][:2] == first["scores"] and more["answers"][:2] == first["answers"]
    assert more["contexts"] == [0, 1, 2, 3] and more["seconds"] >= first["seconds"]
    assert more["distances"][:2] == first["distances"] and records.problem("ruler", [more]) is None
    key = records.record_kind("ruler").key
    held = [r for r in json.loads((run / "eval" / "ruler.json").read_text()) if key(r) == key(more)]
    assert [r["count"] for r in held] == [4]


@pytest.mark.slow
def test_a_designed_book_cell_records_its_stretches_and_an_older_record_gets_them(trained, tmp_path):
    """niah_single_2 (the book haystack) placed by design: the record keeps each prompt's stretch of the
    books ([first word, words]); a record made before stretches were kept (spans removed) gets the same
    ones when the cell is found done again, its prompts built again and checked, nothing asked anew; the
    stretches drawn apart (--haystack_stretches disjoint) are another record."""
    import shutil
    from corpora.ruler import haystacks
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    options = {"ruler_tasks": ("niah_single_2",), "samples": 2, "needle_distances": ("300", "700")}
    request = kinds_lib.Request(lengths=(1024,), options=options, skip_done=True)
    (first,) = kinds_lib.evaluate_kinds(run, ("ruler",), request)["ruler"]
    assert first["haystack_words"] == len(haystacks.book_words()) and len(first["spans"]) == 2
    assert all(words > 50 for _, words in first["spans"]) and records.problem("ruler", [first]) is None
    path = run / "eval" / "ruler.json"
    older = [{k: v for k, v in r.items() if k not in ("spans", "haystack_words")} for r in json.loads(path.read_text())]
    path.write_text(json.dumps(older))
    assert kinds_lib.evaluate_kinds(run, ("ruler",), request)["ruler"] == []  # found done: nothing scored
    (again,) = [r for r in json.loads(path.read_text()) if r["task"] == "niah_single_2"]
    assert again == first
    apart = kinds_lib.Request(lengths=(1024,), options={**options, "haystack_stretches": "disjoint"}, skip_done=True)
    (drawn_apart,) = kinds_lib.evaluate_kinds(run, ("ruler",), apart)["ruler"]
    assert drawn_apart["stretches"] == "disjoint" and drawn_apart["spans"] != first["spans"]
    assert records.problem("ruler", [drawn_apart]) is None
    from experiment.report.pairs import shared_text_groups
    assert shared_text_groups(drawn_apart["contexts"], drawn_apart["spans"], drawn_apart["haystack_words"]).tolist() == [0, 1]
    kept = [r for r in json.loads(path.read_text()) if r["task"] == "niah_single_2"]
    assert len(kept) == 2  # the two ways of drawing the stretches are two records, never one replacing the other
