"""Shared fixtures: a tiny config of the demo, the path of the shared WikiText data, and the
tokenizers of the passkey tests (tests/corpora/test_passkey.py, tests/test_passkey.py)."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# Entry points run by the tests cache compiled programs in a folder of this session, not in ~/.cache;
# the process that made it (xdist's controller, or the only one) removes it at the end.
_MADE_CACHE = "LX_COMPILATION_CACHE" not in os.environ
if _MADE_CACHE:
    os.environ["LX_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="lengthx_xla_")
# and the CPU kernels they compile (models/attention/native/), once per test run, shared by the workers
_MADE_KERNELS = "LX_KERNEL_CACHE" not in os.environ
if _MADE_KERNELS:
    os.environ["LX_KERNEL_CACHE"] = tempfile.mkdtemp(prefix="lengthx_kernels_")
# and the built-in corpus's documents (corpora/builtin.py), read once, not in every process that trains
_MADE_CORPORA = "LX_CORPUS_CACHE" not in os.environ
if _MADE_CORPORA:
    os.environ["LX_CORPUS_CACHE"] = tempfile.mkdtemp(prefix="lengthx_corpora_")


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        for made, name in ((_MADE_CACHE, "LX_COMPILATION_CACHE"), (_MADE_KERNELS, "LX_KERNEL_CACHE"),
                           (_MADE_CORPORA, "LX_CORPUS_CACHE")):
            if made:
                shutil.rmtree(os.environ[name], ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache():
    """The test processes cache their own programs in that folder too (xdist's workers share it): a
    program that several tests build again compiles once in the whole run (LX_COMPILATION_CACHE=off:
    nowhere)."""
    from experiment.runtime import accelerator
    yield accelerator.enable_compilation_cache()


SHARED_WIKITEXT = REPO.parent / "shared" / "data" / "wikitext"


def tiny_config(scheme: str = "alibi"):
    from configs import demo
    c = demo.get_config(scheme)
    c.model.update(dict(num_layers=2, d_model=32, num_heads=4, mlp_dim=64))
    c.train.update(dict(seq_len=16, batch_size=8, steps=6, log_every=1, checkpoint_every=2,
                        warmup_steps=2, lr=3e-3))
    c.eval.update(dict(length_multipliers=(1, 2), batch_tokens=4096))
    return c


def run_entry(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run an entry point (train.py, eval_extrapolate.py, ...) as a user would."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("LX_TRACEBACK", None)
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture
def wikitext103():
    folder = SHARED_WIKITEXT / "wikitext-103"
    if not (folder / "wiki.valid.tokens").exists():
        pytest.skip("../shared/data/wikitext is not present")
    return folder


PASSKEY_WORDS = ["the grass is green . the sky is blue . the sun is yellow . here we go . there and back again .",
                 "key 0 1 2 3 4 5 6 7 8 9"]


@pytest.fixture(scope="module")
def tokenizers():
    """A byte, a word and a small BPE tokenizer that can all write the passkey task's sentences."""
    import corpora
    lines = [" ".join(PASSKEY_WORDS).replace(" .", "."), "a key 1234 and 98 of 7650 words", "the quick brown fox"] * 20
    return {"byte": corpora.ByteTokenizer(),
            "word": corpora.WordTokenizer.from_lines(PASSKEY_WORDS),
            "bpe": corpora.BPETokenizer.train(lines, 300)}
