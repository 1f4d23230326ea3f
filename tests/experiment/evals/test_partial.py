"""A generating evaluation's cell interrupted part-way goes on from the answers it kept
(experiment/evals/partial.py): RULER's cells and the generated passkey's lengths, on a tiny imported
Llama whose generation is replaced by one that reads the answer off the prompt (or stops, as a Ctrl-C
would, at a chosen batch)."""
import json
import re

import pytest

from experiment.convert.hf import import_hf
from experiment.evals import ruler
from experiment.evals.kinds import Request, evaluate_kinds
from experiment.evals.partial import FOLDER, Partial
from experiment.runtime import interrupts
from experiment.store.run import RunDir
from tests.experiment.convert.test_hf import checkpoint, local_corpus

RULER = {"ruler_tasks": ("niah_single_1",), "samples": 4}
PASSKEY = {"passkey_form": "generated", "passkey_depths": (0.1, 0.9), "passkey_per_cell": 2}


def _imported(tmp_path, name):
    (tmp_path / name).mkdir()
    corpus = local_corpus(tmp_path / name, lines=20)
    return import_hf(checkpoint(tmp_path / name, "llama"), tmp_path / name / "run",
                     data={"source": "local", "path": str(corpus)}).path


def _reader(tokenizer, pattern: str, calls: list, stop_at: int | None = None):
    """A stand-in for models.generate.generate: the number after `pattern` in each prompt; raises as a
    Ctrl-C at the safe point would on call `stop_at` (1-based)."""
    def generate(model, prompts, max_new_tokens, stop=None, tokenizer_=None, **kw):
        calls.append(len(prompts))
        if stop_at is not None and len(calls) == stop_at:
            raise interrupts.Interrupted("stopped by the test")
        found = [re.search(pattern, tokenizer.decode(p)) for p in prompts]
        return [list(tokenizer.encode_lines([f" {m.group(1) if m else 0}"])[:-1]) for m in found]
    return generate


def _tokenizer(path):
    run = RunDir(path)
    return run.tokenizer(run.load_config().data, write=False)


def test_an_interrupted_ruler_cell_goes_on_from_its_kept_answers_and_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    stopped, fresh = _imported(tmp_path, "a"), _imported(tmp_path, "b")
    tok = _tokenizer(stopped)
    request = Request(lengths=(1024,), options=RULER, batch_tokens=2048, skip_done=True)  # 2 prompts a batch
    calls = []
    monkeypatch.setattr(ruler, "generate", _reader(tok, r"is: (\d+)\.", calls, stop_at=2))
    with pytest.raises(interrupts.Interrupted):
        evaluate_kinds(stopped, ("ruler",), request)
    (kept,) = (RunDir(stopped).eval_dir / FOLDER).iterdir()
    assert len(json.loads(kept.read_text())["answers"]) == 2 and not RunDir(stopped).records("ruler")
    calls.clear()
    monkeypatch.setattr(ruler, "generate", _reader(tok, r"is: (\d+)\.", calls))
    (resumed,) = evaluate_kinds(stopped, ("ruler",), request)["ruler"]
    assert calls == [2]  # only the second batch generated again
    assert not kept.exists()  # the record written, the kept answers gone
    (whole,) = evaluate_kinds(fresh, ("ruler",), request)["ruler"]
    assert resumed["count"] == 4 and resumed["scores"] == whole["scores"] and resumed["answers"] == whole["answers"]
    assert resumed["answer_tokens"] == whole["answer_tokens"] and resumed["scores"] == [1.0] * 4


def test_an_interrupted_passkey_length_goes_on_and_other_settings_do_not_read_its_answers(tmp_path, monkeypatch):
    import models.generate
    path = _imported(tmp_path, "a")
    tok = _tokenizer(path)
    request = Request(lengths=(512,), options=PASSKEY, batch_tokens=1024)  # 2 prompts a batch, 2 batches
    calls = []
    monkeypatch.setattr(models.generate, "generate", _reader(tok, r"passkey is (\d+)\.", calls, stop_at=2))
    with pytest.raises(interrupts.Interrupted):
        evaluate_kinds(path, ("passkey",), request)
    folder = RunDir(path).eval_dir / FOLDER
    assert len(list(folder.iterdir())) == 1
    calls.clear()
    monkeypatch.setattr(models.generate, "generate", _reader(tok, r"passkey is (\d+)\.", calls))
    other = Request(lengths=(512,), options={**PASSKEY, "passkey_seed": 7}, batch_tokens=1024)
    evaluate_kinds(path, ("passkey",), other)
    assert calls == [2, 2]  # other keys: a cell of its own, the kept answers not used
    calls.clear()
    out = evaluate_kinds(path, ("passkey",), request)["passkey"]
    assert calls == [2] and [r["accuracy"] for r in out] == [1.0, 1.0] and not list(folder.iterdir())


def test_kept_answers_that_do_not_fit_start_the_cell_again(tmp_path):
    run = RunDir(tmp_path / "run", writer=True)
    prompts = [[1, 2], [3, 4]]
    cell = Partial.open(run, "ruler", {"task": "vt"}, prompts)
    cell.add([["a", 1]], 3.0)
    again = Partial.open(run, "ruler", {"task": "vt"}, prompts)
    assert again.answers == [["a", 1]] and again.seconds == 3.0 and again.total_seconds(2.0) == 5.0
    assert Partial.open(run, "ruler", {"task": "vt"}, [[1, 2], [3, 5]]).answers == []  # other prompts
    again.path.write_text(json.dumps({"answers": [1, 2, 3], "seconds": 1}))
    assert Partial.open(run, "ruler", {"task": "vt"}, prompts).answers == []  # more answers than prompts
    again.path.write_text("{not json")
    assert Partial.open(run, "ruler", {"task": "vt"}, prompts).answers == []
    assert Partial.open(RunDir(tmp_path / "run", writer=False), "ruler", {"task": "vt"}, prompts).path is None
