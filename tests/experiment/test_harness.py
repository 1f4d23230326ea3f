"""The lm-evaluation-harness model `lengthx` (experiment/harness.py) on local tasks, offline: a
generation task, a multiple-choice one and a rolling-perplexity one over the tiny Llama checkpoint,
each against what our own code computes directly. lm_eval is not part of the tests' install (its
dependencies are heavy: `pip install -e '.[harness]'`); where it is missing these tests skip."""
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")

from experiment.generation import open_source  # noqa: E402
from experiment.harness import LengthxLM  # noqa: E402
from models.generate import generate  # noqa: E402

TINY = "tests/fixtures/hf_tiny/llama"
QUESTIONS = [{"question": "The quick brown", "answer": " fox", "choices": ["fox", "dog", "cat"], "label": 0},
             {"question": "rotary embeddings rotate", "answer": " queries", "choices": ["keys", "queries"],
              "label": 1}]
TEXTS = [{"page": "The quick brown fox jumps over the lazy dog. " * 6}]


def tasks(tmp_path) -> list[str]:
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (tmp_path / "pages.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TEXTS))
    common = "dataset_path: json\ntest_split: train\n"
    (tmp_path / "gen.yaml").write_text(
        f"task: lengthx_gen\n{common}dataset_kwargs:\n  data_files: {tmp_path / 'qa.jsonl'}\n"
        "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['.']\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    (tmp_path / "mc.yaml").write_text(
        f"task: lengthx_mc\n{common}dataset_kwargs:\n  data_files: {tmp_path / 'qa.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{label}}'\n"
        "doc_to_choice: '{{choices}}'\nmetric_list:\n  - metric: acc\n")
    (tmp_path / "roll.yaml").write_text(
        f"task: lengthx_roll\n{common}dataset_kwargs:\n  data_files: {tmp_path / 'pages.jsonl'}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{page}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    return ["lengthx_gen", "lengthx_mc", "lengthx_roll"]


def test_lengthx_runs_local_tasks_as_our_code_computes_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    names = tasks(tmp_path)
    lm = LengthxLM(pretrained=TINY, max_length=32)
    out = lm_eval.simple_evaluate(model=lm, tasks=names, log_samples=True,
                                  task_manager=lm_eval.tasks.TaskManager(include_path=str(tmp_path)))
    source = open_source(TINY)
    model = source.model(None, 32)
    # generation: greedy, cut at the stop string
    for sample in out["samples"]["lengthx_gen"]:
        ids = source.encode(sample["doc"]["question"])
        text = source.decode(generate(model, [ids], 6, stop=[source.tokenizer.eos_id], tokenizer=source.tokenizer)[0])
        assert sample["resps"][0][0] == text.split(".")[0]
    # multiple choice: each choice's log-probability after the question and the harness's delimiter " "
    for sample in out["samples"]["lengthx_mc"]:
        doc = sample["doc"]
        for (score, _), choice in zip([r[0] for r in sample["resps"]], doc["choices"]):
            context, whole = source.encode(doc["question"]), source.encode(doc["question"] + " " + choice)
            logits = np.asarray(model(jnp.asarray([whole])))[0]
            log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
                - logits.max(-1, keepdims=True)
            expected = sum(log_probs[t - 1, whole[t]] for t in range(len(context), len(whole)))
            assert score == pytest.approx(expected, abs=1e-3)
    # rolling: every token once, in windows of max_length targets, the first after the end-of-sequence token
    ids = source.encode(TEXTS[0]["page"], special=False)
    total = 0.0
    for start in range(0, len(ids), 32):
        window = ([source.tokenizer.eos_id] if start == 0 else [ids[start - 1]]) + ids[start:start + 32]
        logits = np.asarray(model(jnp.asarray([window[:-1]])))[0]
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        total += sum(log_probs[t, window[t + 1]] for t in range(len(window) - 1))
    rolled = out["samples"]["lengthx_roll"][0]["resps"][0][0]
    assert len(ids) > 64 and rolled == pytest.approx(total, rel=1e-4)
    assert out["results"]["lengthx_mc"]["acc,none"] in (0.0, 0.5, 1.0)


def test_lengthx_refuses_what_it_cannot_do_honestly(tmp_path):
    lm = LengthxLM(pretrained=TINY, max_length=8)
    request = type("Request", (), {"args": ("The quick brown fox jumps over the lazy dog", {"max_gen_toks": 4})})
    with pytest.raises(ValueError, match="max_length=8"):
        lm.generate_until([request])
    with pytest.raises(ValueError, match="unknown colour"):
        LengthxLM(pretrained=TINY, colour="blue")
    for name, value in (("max_length", "2.5"), ("max_gen_toks", "nan"), ("batch_size", "0")):
        with pytest.raises(ValueError, match=rf"^lengthx model_args: {name}={value}: give a whole number >= 1$"):
            LengthxLM(pretrained=TINY, **{name: value})
    with pytest.raises(FileNotFoundError, match="^pretrained=no/such/run: no such file or folder"):
        LengthxLM(pretrained="no/such/run")
    with pytest.raises(ValueError, match="posenc.rope.yarn_scale"):  # the method sets it otherwise
        LengthxLM(pretrained=TINY, method="yarn", max_length=256, **{"posenc.rope.yarn_scale": "2"})


@pytest.mark.slow
def test_the_harness_command_knows_lengthx(tmp_path):
    """`python -m experiment.harness` is the lm_eval command with `lengthx` registered."""
    names = tasks(tmp_path)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "experiment.harness", "--model", "lengthx", "--model_args",
                           f"pretrained={TINY},method=yarn,max_length=128", "--tasks", names[1], "--include_path",
                           str(tmp_path), "--output_path", str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lengthx_mc" in done.stdout and "acc" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "experiment.harness", "--model", "lengthx", "--model_args",
                          "pretrained=no/such/run", "--tasks", names[1], "--include_path", str(tmp_path)],
                         env={k: v for k, v in env.items() if k != "LX_TRACEBACK"}, capture_output=True, text=True,
                         timeout=900)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert bad.stderr.strip().splitlines()[-1].startswith("error: pretrained=no/such/run: no such file or folder")
