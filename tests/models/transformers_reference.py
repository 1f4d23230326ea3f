"""What transformers computed from a pretrained model's file (tests/fixtures/<name>/README.md), and
the checks of our model and tokenizer against it that the real-model tests (test_gguf_smollm2.py,
test_gguf_gemma3.py) share."""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def load(name: str, text_file: str) -> dict:
    """tests/fixtures/NAME: reference.npz's arrays, reference.json's fields, and `text`, the WikiText
    text the ids were encoded from."""
    folder = FIXTURES / name
    stored = np.load(folder / "reference.npz")
    return {**{k: stored[k] for k in stored.files}, **json.loads((folder / "reference.json").read_text()),
            "text": (folder / text_file).read_text(encoding="utf-8")}


def check_scores(model, reference: dict) -> np.ndarray:
    """Per-token NLL of reference['ids'] (float32 log-softmax, as the reference) within 2e-4 of
    transformers' on the mean and 5e-3 on every token, the same argmax; returns the logits."""
    ids = reference["ids"]
    logits = jax.jit(lambda x: model(x))(jnp.asarray(ids)[None])[0]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -np.asarray(jnp.take_along_axis(logp[:-1], jnp.asarray(ids[1:])[:, None], axis=-1)[:, 0], np.float64)
    diff = nll - reference["nll"]
    print(f"mean NLL {nll.mean():.6f} vs transformers {reference['nll'].mean():.6f} (difference {diff.mean():.2e}); "
          f"largest per-token difference {np.abs(diff).max():.2e}")
    assert abs(nll.mean() - reference["nll"].mean()) < 2e-4
    assert np.abs(diff).max() < 5e-3
    np.testing.assert_array_equal(np.asarray(jnp.argmax(logits, axis=-1)), reference["argmax"])
    return np.asarray(logits)


def check_tokenizer(tokenizer, reference: dict) -> None:
    """The probe string's ids and the text's first ids equal transformers'."""
    assert tokenizer.encode(reference["probe"]).ids == reference["probe_ids"].tolist()
    assert tokenizer.encode(reference["text"]).ids[:len(reference["ids"])] == reference["ids"].tolist()
