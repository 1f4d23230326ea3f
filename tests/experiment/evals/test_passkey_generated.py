"""The passkey's generated form (experiment/evals/passkey_generated.py) on a tiny imported Llama: records
with `form` "generated", their outputs and exact-match accuracy, kept apart from the compact form's."""
import re

import numpy as np
import pytest

from experiment.convert.hf import import_hf
from experiment.evals.kinds import Request, evaluate_kinds
from experiment.report import passkey as passkey_report
from experiment.store.run import RunDir
from tests.experiment.convert.test_hf import checkpoint, local_corpus

LENGTH = 512
GENERATED = {"passkey_form": "generated", "passkey_depths": (0.1, 0.9), "passkey_per_cell": 2}


@pytest.fixture
def imported(tmp_path):
    corpus = local_corpus(tmp_path, lines=20)
    return import_hf(checkpoint(tmp_path, "llama"), tmp_path / "run", data={"source": "local", "path": str(corpus)})


@pytest.mark.slow
def test_the_model_generates_with_its_cache_under_a_method(imported):
    real = evaluate_kinds(imported.path, ("passkey",), Request(lengths=(1024,), methods=("direct", "yarn"), options={
        **GENERATED, "passkey_depths": (0.5,), "passkey_per_cell": 1}))["passkey"]
    assert [(r["method"], r["form"], r["count"], r["prompt_tokens"], r["new_tokens"]) for r in real] == [
        ("direct", "generated", 1, 1015, 9), ("yarn", "generated", 1, 1015, 9)]
    assert all(isinstance(r["outputs"][0], str) and r["digits"] == 5 and r["chance"] == 1e-5 for r in real)
    assert real[1]["overrides"] == {"posenc.rope.yarn_scale": "16"}  # 1024 = 16 x the window of 64


def test_generated_answers_are_scored_by_exact_match_and_kept_apart_from_the_compact_form(imported, monkeypatch):
    import models.generate
    tokenizer = RunDir(imported.path).tokenizer(RunDir(imported.path).load_config().data, write=False)

    def oracle(model, prompts, max_new_tokens, stop=None, tokenizer=None):  # reads the key from the prompt
        keys = [re.search(r"passkey is (\d+)\.", tokenizer.decode(p)).group(1) for p in prompts]
        return [list(tokenizer.encode_lines([f" {key}"])[:-1]) for key in keys]
    monkeypatch.setattr(models.generate, "generate", oracle)
    out = evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options=GENERATED))["passkey"]
    assert [(r["depth"], r["accuracy"], r["count"]) for r in out] == [(0.1, 1.0, 2), (0.9, 1.0, 2)]
    assert all(re.fullmatch(r" \d{5}", text) for r in out for text in r["outputs"])
    monkeypatch.setattr(models.generate, "generate", lambda model, prompts, *a, **k: [
        list(tokenizer.encode_lines([" 00000"])[:-1])] * len(prompts))
    blind = evaluate_kinds(imported.path, ("passkey",), Request(lengths=(2 * LENGTH,), options=GENERATED))["passkey"]
    assert [r["accuracy"] for r in blind] == [0.0, 0.0]
    compact = evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options={
        "passkey_depths": (0.1, 0.9), "passkey_per_cell": 1}))["passkey"]
    saved = RunDir(imported.path).records("passkey")  # the two forms' records of one cell both kept
    assert {r["form"] for r in saved if r["eval_length"] == LENGTH and r["depth"] == 0.1} == {"compact", "generated"}
    assert compact[0]["form"] == "compact"
    again = Request(lengths=(LENGTH, 2 * LENGTH), options=GENERATED, skip_done=True)
    assert evaluate_kinds(imported.path, ("passkey",), again) == {"passkey": []}

    table = passkey_report.passkey_table([("llama", saved)])
    assert "| llama, generated |" in table.replace(", 5 digits", "") or "llama, generated" in table
    generated_row = next(line for line in table.splitlines() if line.startswith(f"| {LENGTH} |"))
    assert re.search(r"\d\.\d\d \[\d\.\d\d, \d\.\d\d\]", generated_row)  # a Wilson interval beside it
    assert [key[3] for key in passkey_report._series(saved)] == ["compact", "generated"]


CHAT = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}" \
       "{% if add_generation_prompt %}<|assistant|>{% endif %}"


def test_the_chat_form_puts_the_prompt_in_the_models_template_and_is_a_series_of_its_own(imported, monkeypatch):
    import models.generate
    run = RunDir(imported.path)
    tokenizer = run.tokenizer(run.load_config().data, write=False)
    chat = {**GENERATED, "passkey_form": "chat"}
    with pytest.raises(ValueError, match="no chat template .*--passkey_form generated"):
        evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options=chat))
    (run.path / "chat_template.jinja").write_text(CHAT)
    prompts = []

    def oracle(model, batch, max_new_tokens, stop=None, tokenizer=None):
        prompts.extend(tokenizer.decode(p) for p in batch)
        keys = [re.search(r"passkey is (\d+)\.", tokenizer.decode(p)).group(1) for p in batch]
        return [list(tokenizer.encode_lines([f" {key}"])[:-1]) for key in keys]
    monkeypatch.setattr(models.generate, "generate", oracle)
    out = evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options=chat))["passkey"]
    assert [(r["form"], r["depth"], r["accuracy"], r["prompt_tokens"]) for r in out] == [
        ("chat", 0.1, 1.0, LENGTH - 9), ("chat", 0.9, 1.0, LENGTH - 9)]
    assert len(prompts) == 4 and all(p.replace(" ", "").startswith("<|user|>Somewhere") for p in prompts)
    assert all(p.replace(" ", "").endswith("passkey?<|end|><|assistant|>Thepasskeyis") for p in prompts)
    evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options=GENERATED))
    saved = run.records("passkey")
    assert sorted(r["form"] for r in saved if r["depth"] == 0.1) == ["chat", "generated"]  # both kept
    assert evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options=chat, skip_done=True)) == {
        "passkey": []}
    table = passkey_report.passkey_table([("llama", saved)])
    assert "generated, chat" in table


def test_a_length_too_short_names_the_shortest_that_works(imported):
    """Issue 67, case 9: --lengths 280 said "needs length >= 277 tokens, got 271", the prompt's budget
    against a bound and both called "length"; the shortest length that works was 286."""
    from corpora import passkey as task
    from experiment.evals.passkey import PasskeySpec, checked_spec
    run = RunDir(imported.path)
    config = run.load_config()
    spec = PasskeySpec(form="generated")
    shortest = task.instructed_minimum(run.tokenizer(config.data, write=False), spec.seed) + task.answer_tokens(5)
    with pytest.raises(task.PasskeyError, match=rf"^--lengths {shortest - 1}: the generated passkey needs L >= "
                                                rf"{shortest} tokens \(a prompt of at least {shortest - 9} and 9 kept "
                                                rf"for the answer: 5 digits \+ 4\); give lengths >= {shortest}$"):
        checked_spec(run, config, [shortest - 1], spec, {})
    assert checked_spec(run, config, [shortest], spec, {}).digits == 5


def test_keys_placed_by_distance_sit_where_asked_and_are_tabulated_apart(imported, monkeypatch, tmp_path):
    """Issue 65, item 1: the generated passkey's key at a chosen distance from the prompt's end, in tokens
    or multiples of the window (64 here), recorded with each example's distance, resumed by distance,
    in a table of its own, never pooled with the depths."""
    import models.generate
    from corpora import passkey as task
    tokenizer = RunDir(imported.path).tokenizer(RunDir(imported.path).load_config().data, write=False)
    asked = []

    def oracle(model, prompts, max_new_tokens, stop=None, tokenizer=None):
        asked.extend(prompts)
        keys = [re.search(r"passkey is (\d+)\.", tokenizer.decode(p)).group(1) for p in prompts]
        return [list(tokenizer.encode_lines([f" {key}"])[:-1]) for key in keys]
    monkeypatch.setattr(models.generate, "generate", oracle)
    options = {**GENERATED, "passkey_distances": ("300", "4w")}
    out = evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options=options))["passkey"]
    assert [(r["distance"], r["distances"], r["accuracy"], r["placement"]) for r in out] == [
        ("300", [300, 300], 1.0, "designed"), ("4w", [256, 256], 1.0, "designed")]
    for prompt, back in zip(asked, (300, 300, 256, 256)):  # the key sentence begins `back` tokens from the end
        text = tokenizer.decode(prompt[len(prompt) - back:])
        assert text.lstrip().startswith("The passkey is ")  # (the question, "What is the passkey?", comes last)
    again = Request(lengths=(LENGTH,), options=options, skip_done=True)
    assert evaluate_kinds(imported.path, ("passkey",), again) == {"passkey": []}
    depths = evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options=GENERATED))["passkey"]
    assert [r["depth"] for r in depths] == [0.1, 0.9] and "distance" not in depths[0]  # not taken for done
    paths = passkey_report.write([imported.path], tmp_path / "report")
    text = (tmp_path / "report" / "passkey.md").read_text()
    assert "## Keys placed by distance from the prompt's end" in text
    assert "| direct | generated | 512 | 300 (300-300) | 2/2 [" in text.replace("as trained", "direct")
    assert paths["md"].endswith("passkey.md")
    with pytest.raises(ValueError, match="--passkey_distances places the key of the generated and chat forms"):
        evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options={"passkey_distances": ("300",)}))
    with pytest.raises(task.PasskeyError, match=r"--passkey_distances 600 at --lengths 512 .*it can sit"):
        evaluate_kinds(imported.path, ("passkey",), Request(lengths=(LENGTH,), options={**options,
                                                                                      "passkey_distances": ("600",)}))
