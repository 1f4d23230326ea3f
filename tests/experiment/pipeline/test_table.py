"""The table of every scheme (experiment/pipeline/table.py, its rows configs/all_schemes.py): its rows
cover the registry, each option's factor follows its stated rule at every length, a study is checked,
and a second call redoes nothing (slow: trains)."""
import json

import pytest

import posenc
from experiment.cli import config_file
from experiment.evals.passkey import PasskeySpec
from experiment.pipeline import table as scheme_table
from experiment.pipeline.run import run_config
from experiment.report import schemes as report
from experiment.store import checkpoints
from experiment.store.run import RunDir
from tests.conftest import REPO, run_entry, tiny_config
from tests.experiment.test_cli import assert_clean_error

LENGTHS = (64, 128, 256, 512, 1024)
ALL_SCHEMES = config_file(str(REPO / "configs" / "all_schemes.py"))  # the study, as sweep.py --table reads it


def test_rows_cover_every_registered_scheme_and_the_options_follow_their_rules():
    rows = scheme_table.rows(ALL_SCHEMES.get_table())
    assert len({r.name for r in rows}) == len(rows)
    assert set(posenc.names()) <= {r.run for r in rows}
    assert {"logn_alibi", "randomized_alibi", "rope_p0.75"} <= {r.run for r in rows}
    options = {r.name: r for r in rows if r.overrides}
    assert sorted(options) == sorted(f"rope + {name}" for name, *_ in ALL_SCHEMES.EXTENSIONS)
    assert all(r.run == "rope" for r in options.values())  # evaluated on the one rope run
    at = {name: [r.overrides_at(n, 64) for n in LENGTHS] for name, r in options.items()}
    assert [o["posenc.rope.pi_factor"] for o in at["rope + PI"]] == ["1", "0.5", "0.25", "0.125", "0.0625"]
    assert [o["posenc.rope.yarn_scale"] for o in at["rope + YaRN"]] == ["1", "2", "4", "8", "16"]
    groups = [int(o["posenc.rope.self_extend_group"]) for o in at["rope + Self-Extend"]]
    assert groups == [1, 3, 7, 15, 31]
    for n, g in zip(LENGTHS, groups):  # the largest grouped relative position stays within L
        assert 32 + (n - 32) / g <= 64 and (g == 1 or 32 + (n - 32) / (g - 1) > 64)
    assert all(o == {"model.attention_sinks": "10"} for o in at["rope + LM-Infinite"])
    by_name = {r.name: r for r in rows}  # a departure from the paper named in its row (issue 34)
    assert by_name["ssmax"].rule.startswith("scales the query vector") and "convert_llama_model" in by_name[
        "rope + LM-Infinite"].rule

    base = tiny_config("alibi")
    base.train.seq_len = 64
    described = {}
    for r in rows:
        config = run_config(base, r.scheme, None, dict(r.settings))
        entry = scheme_table.describe_row(r, config)
        described[entry["name"]] = entry
    assert described["logn [alibi]"]["family"] == "wrapper of relative"
    assert described["dape [kerple_log]"]["citation"] == "Zheng et al. 2024; base: Chi et al. 2022"
    assert described["rope + YaRN"]["citation"] == "Su et al. 2021; YaRN: Peng et al. 2023"
    assert described["rope + PI"]["overrides"]["128"] == {"posenc.rope.pi_factor": "0.5"}
    assert described["fox"]["family"] == posenc.get("fox").family


@pytest.mark.parametrize("study, expected", [
    ({"rows": []}, "no rows"),
    ({"every_scheme": True, "rows": [{"name": "alibi", "run": "x", "scheme": "alibi"}]}, "rows named twice: alibi"),
    ({"rows": [{"name": "a", "run": "a", "scheme": "rope", "overrides": ("ratoi", "posenc.rope.yarn_scale")}]},
     "overrides rule 'ratoi' is not one of ratio, inverse_ratio"),
    ({"rows": [{"name": "a", "scheme": "rope"}]}, "row 0 .* with name, run and scheme given"),
    ({"rows": [], "colums": 3}, "must be a dict of every_scheme"),
    ({"every_scheme": True, "notes": {"ssmaxx": "x"}}, "notes of ssmaxx: no such every_scheme row"),
])
def test_a_study_that_cannot_be_a_table_is_refused_naming_where(study, expected):
    with pytest.raises(ValueError, match=f"^configs/x.py: get_table\\(\\).*{expected}"):
        scheme_table.rows(study, "configs/x.py: get_table()")


def test_sweep_table_reads_the_rows_from_the_config_file(tmp_path):
    """sweep.py --table takes the study from the --config file's get_table(); a config without one is
    one line naming configs/all_schemes.py."""
    result = run_entry("sweep.py", "--config", "configs/passkey.py", "--table", "--workdir", str(tmp_path))
    assert_clean_error(result, "configs/passkey.py has no get_table()", "--config configs/all_schemes.py")
    result = run_entry("sweep.py", "--config", "configs/all_schemes.py", "--table", "--workdir", str(tmp_path),
                       "--schemes", "rope_p0.75,nosuch")
    assert_clean_error(result, "--schemes nosuch: no such run in the table", "logn_alibi, randomized_alibi, rope_p0.75")
    assert not any(tmp_path.iterdir())  # refused before any run started


@pytest.mark.slow
def test_the_table_builds_resumes_without_redoing_anything_and_marks_what_cannot_be(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.txt").write_text("the grass is green. the sky is blue. here we go.\n" * 100)
    base = tiny_config("alibi")
    base.data.update(dict(source="local", path=str(data), passkey_fraction=0.5))
    base.train.update(dict(seq_len=32, steps=2))
    spec = PasskeySpec(depths=(0.0, 1.0), per_cell=2)
    restores = []
    real = checkpoints.restore
    monkeypatch.setattr(checkpoints, "restore", lambda *a, **k: restores.append(a[0].path.name) or real(*a, **k))
    table = scheme_table.rows(ALL_SCHEMES.get_table())
    paths = scheme_table.build(base, table, tmp_path / "runs", tmp_path / "out", ["alibi", "learned", "rope"], spec)
    assert paths["failed"] == {}
    assert sorted(restores) == ["alibi", "learned", "rope"]  # every row of a run from one restore
    rows = {r["name"]: r for r in json.loads(open(paths["json"]).read())["rows"]}
    assert set(rows["alibi"]["ppl"]) == set(rows["alibi"]["passkey"]) == {"32", "64"}
    assert set(rows["learned"]["ppl"]) == {"32"} and "table of 32 positions" in rows["learned"]["missing"]["64"]
    for name, *_ in ALL_SCHEMES.EXTENSIONS:  # each option evaluated with its own overrides
        assert set(rows[f"rope + {name}"]["ppl"]) == {"32", "64"}, name
    assert rows["rope + PI"]["ppl"]["64"] != rows["rope"]["ppl"]["64"]
    assert rows["fox"]["missing"]["32"] == report.NOT_YET  # not run this time
    timings = json.loads((tmp_path / "runs" / report.TIMINGS).read_text())
    assert set(timings) == {"alibi", "learned", "rope"} and timings["rope"]["train_wall_s"] > 0

    monkeypatch.setattr(scheme_table, "train", lambda *args, **kwargs: pytest.fail("trained again"))
    restores.clear()
    again = scheme_table.build(base, table, tmp_path / "runs", tmp_path / "out", ["alibi", "learned", "rope"], spec)
    assert again["failed"] == {} and json.loads(open(again["json"]).read())["rows"] == list(
        json.loads(open(paths["json"]).read())["rows"])
    assert restores == []  # nothing lacking: no checkpoint restored


def test_the_table_trains_the_runs_it_is_asked_for_once_per_seed(tmp_path, monkeypatch):
    """sweep.py --table --schemes rope,fox --seeds 0,1: each run of those rows in RUN and RUN_seed1, every
    row of a run evaluated in each of its folders; the other runs untouched."""
    trained, evaluated = [], []
    monkeypatch.setattr(scheme_table, "is_trained", lambda workdir, config: False)
    monkeypatch.setattr(scheme_table, "opened", lambda workdir, purpose: __import__("contextlib").nullcontext(workdir))
    monkeypatch.setattr(scheme_table, "train", lambda config, run: trained.append((run.name, config.seed)))
    monkeypatch.setattr(scheme_table, "evaluate_run", lambda table, run, config, spec: evaluated.extend(
        (row.name, run.path.name) for row in table) or {})
    paths = scheme_table.build(tiny_config("alibi"), scheme_table.rows(ALL_SCHEMES.get_table()), tmp_path / "runs",
                               tmp_path / "out", ["rope", "fox"], seeds=[0, 1])
    assert paths["failed"] == {}
    assert trained == [("fox", 0), ("rope", 0), ("fox_seed1", 1), ("rope_seed1", 1)]
    assert ("rope + YaRN", "rope_seed1") in evaluated and ("fox", "fox_seed1") in evaluated
    assert len(evaluated) == 2 * (1 + 1 + len(ALL_SCHEMES.EXTENSIONS))  # fox; rope and its extensions; twice


def test_every_row_of_a_run_is_evaluated_in_one_call_that_skips_what_is_there(tmp_path, monkeypatch):
    """One evaluate_kinds call per run (one restore: tests/experiment/evals/test_kinds.py): each set of
    overrides at its lengths, a length two rows share asked once, what a row cannot have left out and
    returned as its cells' reason."""
    calls = []
    monkeypatch.setattr(scheme_table, "impossible", lambda run, config, overrides, lengths: {
        n: f"no {n}" for n in lengths if n > 32 and not overrides})
    monkeypatch.setattr(scheme_table, "evaluate_kinds", lambda run, kinds, request: calls.append((kinds, request)) or {
        "perplexity": [], "passkey": []})
    table = scheme_table.rows({"rows": [
        {"name": "rope", "run": "rope", "scheme": "rope"},
        {"name": "rope + PI", "run": "rope", "scheme": "rope", "overrides": ("inverse_ratio", "posenc.rope.pi_factor")},
        {"name": "rope + dense", "run": "rope", "scheme": "rope", "overrides": ("fixed", {"model.attention": "dense"})},
        {"name": "rope again", "run": "rope", "scheme": "rope"}]})
    base = tiny_config("alibi")
    base.eval.length_multipliers = (1, 2, 4)
    config = run_config(base, "rope", None)  # L = 16
    cannot = scheme_table.evaluate_run(table, RunDir(tmp_path / "rope"), config, PasskeySpec(per_cell=3))
    assert len(calls) == 1 and calls[0][0] == ("perplexity", "passkey")
    request = calls[0][1]
    assert request.skip_done and request.skip_impossible and request.options["passkey_per_cell"] == 3
    assert request.groups == (({}, (16, 32)), ({"posenc.rope.pi_factor": "1"}, (16,)),
                              ({"posenc.rope.pi_factor": "0.5"}, (32,)), ({"posenc.rope.pi_factor": "0.25"}, (64,)),
                              ({"model.attention": "dense"}, (16, 32, 64)))
    assert cannot == {"rope": {"64": "no 64"}, "rope again": {"64": "no 64"}, "rope + PI": {}, "rope + dense": {}}
