"""The registry of evaluation kinds (experiment/evals/kinds.py): one entry per record kind, each
flag read by the kinds that declare it, and one command of every kind restores the checkpoint once."""
import importlib

import pytest

from experiment.evals import kinds as kinds_lib
from experiment.evals.kinds import Request, evaluate_kinds
from experiment.evals.passkey import PasskeySpec, spec_options
from experiment.store import checkpoints, records
from experiment.store.run import RunDir
from experiment.train import train
from tests.conftest import tiny_config


def test_every_record_kind_has_one_entry_and_each_option_names_the_kinds_that_read_it():
    registry = kinds_lib.registry()
    assert list(registry) == list(records.KINDS)  # the record kinds are the one list of kinds
    assert [name for name, kind in registry.items() if kind.default] == ["perplexity"]
    acts_on = kinds_lib.acts_on(registry)
    assert acts_on["split"] == ("perplexity", "attention")
    assert {acts_on[n] for n in ("passkey_depths", "passkey_per_cell", "passkey_digits", "passkey_seed")} == {
        ("passkey",)}
    assert acts_on["stride"] == acts_on["max_tokens"] == ("perplexity",)
    assert sorted(o.name for o in kinds_lib.options(registry)) == sorted(acts_on)  # each flag defined once
    with pytest.raises(ValueError, match="evaluation kinds are perplexity, passkey, attention"):
        kinds_lib.chosen(["perplexity", "loss"])
    for name in records.KINDS:  # a kind's three files: its record kind, its scoring here, its report part
        assert name == "perplexity" or callable(importlib.import_module(f"experiment.report.{name}").report)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kinds")
    data = tmp / "data"
    data.mkdir()
    for split in ("train", "valid"):  # a local folder loads faster than the built-in corpus
        (data / f"{split}.txt").write_text("the grass is green. the sky is blue. here we go.\n" * 100)
    config = tiny_config("alibi")
    config.data.update(dict(source="local", path=str(data)))
    config.train.steps = 2
    train(config, tmp / "run")
    return tmp / "run"


def test_one_command_of_every_kind_restores_the_checkpoint_once(trained, monkeypatch):
    restores = []
    real = checkpoints.restore
    monkeypatch.setattr(checkpoints, "restore", lambda *a, **k: restores.append(a[0].path) or real(*a, **k))
    lines = []
    request = Request(lengths=(32,), options={**spec_options(PasskeySpec(depths=(0.0, 1.0), per_cell=2)),
                                              "max_tokens": 1024, "attention_windows": 2})
    out = evaluate_kinds(trained, ("attention", "perplexity", "passkey"), request, say=lines.append)
    assert restores == [trained]  # three kinds, one restore
    assert list(out) == ["perplexity", "passkey", "attention"]  # the registry's order, as the command prints
    assert [r["eval_length"] for r in out["perplexity"]] == [32] and len(out["passkey"]) == 2
    assert out["attention"][0]["windows"] == 2
    run = RunDir(trained)
    for kind, new in out.items():  # each written to its own file, from the one checkpoint
        assert run.records(kind) == new and {r["step"] for r in new} == {2}
    assert len(lines) == 4 and lines[0].split()[0] == "alibi" and lines[1].startswith("passkey L=")
    assert lines[3].startswith("attention L=32")


def test_groups_of_overrides_share_one_restore_and_a_repeat_restores_nothing(trained, monkeypatch):
    """Request.groups (the table of every scheme: each row's overrides at its lengths) on one restored
    checkpoint; with skip_done, a command whose every record is there restores nothing."""
    restores = []
    real = checkpoints.restore
    monkeypatch.setattr(checkpoints, "restore", lambda *a, **k: restores.append(a[0].path) or real(*a, **k))
    request = Request(groups=(({}, (16,)), ({"model.attention": "dense"}, (16,))), skip_done=True,
                      options={"max_tokens": 256})
    out = evaluate_kinds(trained, ("perplexity",), request)
    assert restores == [trained]
    assert [r.get("overrides", {}) for r in out["perplexity"]] == [{}, {"model.attention": "dense"}]
    restores.clear()
    lines = []
    assert evaluate_kinds(trained, ("perplexity",), request, say=lines.append) == {"perplexity": []}
    assert restores == []
    done = "recorded already with these settings, not scored again (--skip_done): perplexity, "
    assert lines == [done + "as configured, L_valid 16", done + "model.attention=dense, L_valid 16"]


def test_a_bad_option_of_one_kind_is_refused_before_any_kind_scores(trained, monkeypatch):
    monkeypatch.setattr(checkpoints, "restore", lambda *a, **k: pytest.fail("restored before the request was checked"))
    before = {kind: RunDir(trained).records(kind) for kind in records.KINDS}
    bad = Request(lengths=(32,), options={"passkey_depths": (1.5,)})
    with pytest.raises(ValueError, match=r"depths in \[0, 1\]"):
        evaluate_kinds(trained, ("perplexity", "passkey"), bad)
    with pytest.raises(ValueError, match="stride 64 must be between 0"):
        evaluate_kinds(trained, ("perplexity", "attention"), Request(lengths=(32,), options={"stride": 64}))
    assert {kind: RunDir(trained).records(kind) for kind in records.KINDS} == before
