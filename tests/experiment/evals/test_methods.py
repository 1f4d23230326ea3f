"""experiment/evals/methods.py and `eval_extrapolate.py --methods`: each training-free method's options
per length, the evaluation plan, records that carry the method (one report curve per method), and
--skip_done resuming without scoring anything twice."""
from __future__ import annotations

import json
import math

import pytest

from experiment.convert.hf import import_hf
from experiment.evals import Request, evaluate_kinds, methods
from experiment.store import records
from experiment.store.run import RunDir
from tests.conftest import run_entry
from tests.experiment.convert.test_hf import checkpoint, local_corpus


def test_options_follow_the_length_and_a_method_sets_nothing_where_it_changes_nothing():
    L = 8192
    assert methods.options("direct", 32768, L) == {}
    assert methods.options("yarn", 8192, L) == {} and methods.options("yarn", 4096, L) == {}
    assert methods.options("yarn", 16384, L) == {"posenc.rope.yarn_scale": "2"}
    assert methods.options("pi", 32768, L) == {"posenc.rope.pi_factor": "0.25"}
    assert methods.options("self_extend", 32768, L) == {"posenc.rope.self_extend_window": "2048",
                                                        "posenc.rope.self_extend_group": "8"}
    assert methods.options("dca", 8192, L) == {"posenc.rope.dca_chunk_size": "6144", "posenc.rope.dca_local_window": "512"}
    assert methods.options("dca", 6144, L) == {} and methods.options("rerope", 4096, L) == {}
    assert methods.options("rerope", 8192, L) == {"posenc.rope.rerope_window": "4096"}
    assert methods.options("lm_infinite", 8192, L) == {} and methods.options("dynamic_ntk", 8192, L) == {}
    assert methods.options("lm_infinite", 16384, L) == {"model.attention_sinks": "10"}
    assert methods.options("yarn+logn", 16384, L) == {"posenc.rope.yarn_scale": "2", "posenc.name": "logn"}
    assert methods.label("self_extend+logn") == "Self-Extend + log-n"


def test_the_settings_of_results_training_free_are_the_library_s():
    """experiment/study/training_free.py (the study's steps) reads its settings from the library: the
    options it recorded (its integer multiples of L = 64), but for dynamic NTK at L, which changes
    nothing there and is now the model as trained (its records at L equal direct's: 3.97 and 0.86)."""
    from experiment.study import training_free as study
    assert study.settings("PI", 4, 64) == {"posenc.rope.pi_factor": "0.25"}
    assert study.settings("NTK-aware", 16, 64) == {"posenc.rope.ntk_alpha": "16"}
    assert study.settings("YaRN", 1, 64) == {}
    assert study.settings("Self-Extend", 2, 64) == {"posenc.rope.self_extend_window": "16",
                                                    "posenc.rope.self_extend_group": "4"}
    assert study.settings("dynamic NTK", 2, 64) == {"posenc.rope.dynamic_ntk": "true",
                                                    "posenc.rope.dynamic_ntk_factor": "2"}
    assert study.settings("ReRoPE", 1, 64) == {"posenc.rope.rerope_window": "32"}
    assert study.settings("DCA", 8, 64) == {"posenc.rope.dca_chunk_size": "48", "posenc.rope.dca_local_window": "4"}


def test_plan_groups_a_method_s_lengths_by_its_options():
    plan = methods.plan(("direct", "yarn"), (32, 64, 128, 256), 64, {"model.attention": "dense"})
    assert plan == [("direct", {"model.attention": "dense"}, (32, 64, 128, 256)),
                    ("yarn", {"model.attention": "dense"}, (32, 64)),
                    ("yarn", {"model.attention": "dense", "posenc.rope.yarn_scale": "2"}, (128,)),
                    ("yarn", {"model.attention": "dense", "posenc.rope.yarn_scale": "4"}, (256,))]
    # a --set of an option the method sets itself was silently replaced by the method's value (issue 45's rules)
    with pytest.raises(ValueError, match=r"^--set posenc.rope.yarn_scale=8: --methods yarn sets posenc.rope.yarn_scale "
                                         r"itself \(2 at L=128\); drop the --set"):
        methods.plan(("yarn",), (64, 128), 64, {"posenc.rope.yarn_scale": "8"})
    assert methods.plan(("yarn+logn",), (128,), 64, {"posenc.name": "logn"})[0][1]["posenc.name"] == "logn"  # the same


def test_unknown_methods_are_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="unknown method 'rope'.*direct, pi"):
        methods.parse("yarn,rope")
    assert methods.parse("yarn, yarn+logn,yarn") == ("yarn", "yarn+logn")


@pytest.fixture
def imported(tmp_path):
    corpus = local_corpus(tmp_path)
    return import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run", data={"source": "local", "path": str(corpus)})


def test_methods_are_evaluated_in_turn_and_skip_done_resumes(imported):
    request = Request((64, 128), None, options={"max_tokens": 1024}, methods=("direct", "yarn", "self_extend"),
                      skip_done=True)
    first = evaluate_kinds(imported.path, ["perplexity"], request)["perplexity"]
    got = {(r.get("method"), r["eval_length"]): r for r in first}
    assert sorted(got) == [("direct", 64), ("direct", 128), ("self_extend", 64), ("self_extend", 128),
                           ("yarn", 64), ("yarn", 128)]
    assert all(math.isfinite(r["ppl"]) for r in first)
    assert got[("yarn", 128)]["overrides"] == {"posenc.rope.yarn_scale": "2"}
    assert "overrides" not in got[("yarn", 64)]  # within the window YaRN sets nothing: the same model as direct
    # scored once: YaRN at 64 is the evaluation of direct there, its record repeated under YaRN's name
    assert got[("yarn", 64)]["same_as"] == "direct" and got[("yarn", 64)]["nll"] == got[("direct", 64)]["nll"]
    assert "same_as" not in got[("yarn", 128)] and "same_as" not in got[("direct", 64)]
    assert got[("yarn", 128)]["nll"] != got[("direct", 128)]["nll"]
    # one curve per method, whatever its options at each length
    curves = {records.series_key(r) for r in RunDir(imported.path).records("perplexity")}
    assert len(curves) == 3
    assert records.series_label(records.series_key(got[("yarn", 128)])).endswith(", yarn")
    # the same command again scores nothing; one more length is scored alone
    assert evaluate_kinds(imported.path, ["perplexity"], request)["perplexity"] == []
    more = evaluate_kinds(imported.path, ["perplexity"], Request((64, 128, 256), None, options={"max_tokens": 1024},
                                                                methods=("yarn",), skip_done=True))["perplexity"]
    assert [(r["method"], r["eval_length"]) for r in more] == [("yarn", 256)]


def test_eval_extrapolate_methods_and_report_draw_a_curve_per_method(imported, tmp_path):
    result = run_entry("eval_extrapolate.py", "--workdir", str(imported.path), "--lengths", "64,128",
                       "--max_tokens", "1024", "--methods", "direct,yarn+logn", "--passkey", "--perplexity",
                       "--passkey_depths", "0,1", "--passkey_per_cell", "1", "--skip_done")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len([x for x in lines if " ppl " in x]) == 4 and len([x for x in lines if x.startswith("passkey")]) == 8
    assert len([x for x in lines if " yarn+logn " in x]) == 6
    keys = RunDir(imported.path).records("passkey")
    assert {r["method"] for r in keys} == {"direct", "yarn+logn"} and len(keys) == 8
    out = tmp_path / "report"
    result = run_entry("report.py", str(imported.path), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    table = (out / "ppl_vs_length.md").read_text()
    assert "direct" in table and "yarn+logn" in table
    bad = run_entry("eval_extrapolate.py", "--workdir", str(imported.path), "--lengths", "64", "--methods", "yarn,x")
    assert bad.returncode != 0 and "unknown method 'x'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_methods_of_rope_on_a_run_without_rope_name_the_real_cause(tmp_path):
    """Issue 45, item 6: `--methods yarn` on an ALiBi run said `posenc.rope.yarn_scale has no effect ...;
    drop the option (or set posenc.name=rope)`: an option the user never gave, a fix that cannot work."""
    from experiment.evals.kinds import check_request
    from tests.experiment.report.synthetic import fake_run
    run = fake_run(tmp_path, "alibi", 16, "/data/c", {16: 5.0})
    (run / "checkpoints" / "1000").mkdir(parents=True)  # a checkpoint's folder: the request is checked first
    with pytest.raises(ValueError) as error:
        check_request(run, ["perplexity"], Request(lengths=(32,), methods=("direct", "yarn", "pi+logn")))
    message = str(error.value)
    assert message.startswith(f"--methods yarn,pi+logn: YaRN and PI + log-n change RoPE's rotation, and {run} was "
                              f"trained with alibi, not RoPE: give a run trained with posenc.name=rope"), message
    assert "drop the option" not in message and message.endswith("only direct, lm_infinite apply")
    check_request(run, ["perplexity"], Request(lengths=(32,), methods=("direct", "lm_infinite")))
