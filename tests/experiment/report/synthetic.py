"""Run folders as train.py and eval_extrapolate.py leave them, with given records (report input
only, no training): perplexity, and passkey and attention records beside them."""
from __future__ import annotations

import json
import pathlib

import numpy as np

from experiment import config as config_lib
from experiment.store.run import RunDir
from tests.conftest import tiny_config


def fake_run(root: pathlib.Path, scheme: str, train_length: int, corpus_path: str, ppl_by_length: dict,
             tokenizer: str = "word", split: str = "valid", steps: list | None = None, name: str = "",
             data: dict | None = None, seed: int = 0) -> pathlib.Path:
    """A run folder as train.py + eval_extrapolate.py leave it, with given results (report input only);
    steps: the checkpoint step of each record (default 1000 for all), data: config.data overrides,
    seed: the config's seed."""
    config = tiny_config(scheme)
    config.seed = seed
    config.train.seq_len = train_length
    config.data.update({"source": "local", "path": corpus_path, "tokenizer": tokenizer, **(data or {})})
    run = RunDir(root / (name or f"{scheme}_{train_length}"))
    run.path.mkdir(parents=True)
    run.save_config(config_lib.typed(config))
    records = [{"scheme": scheme, "train_length": train_length, "eval_length": l, "stride": l,
                "split": split, "tokens": 217646, "nll": 0.0, "ppl": p, "tokenizer": tokenizer,
                "step": step, "max_tokens": 0, "data": corpus_path,
                "position_nll": [[0, l // 2 - 1, 3.0], [l // 2, l - 1, 2.9]]}
               for (l, p), step in zip(ppl_by_length.items(), steps or [1000] * len(ppl_by_length))]
    path = run.records_path("perplexity")  # written whole: records of several checkpoints may be wanted
    path.parent.mkdir()
    path.write_text(json.dumps(records))
    return run.path


def passkey_records(step: int = 10, lengths=(64, 128, 256, 512), depths=(0.0, 0.5, 1.0)) -> list[dict]:
    return [{"task": "passkey", "scheme": "alibi", "train_length": 64, "eval_length": length, "depth": depth,
             "digits": 4, "accuracy": round(max(0.0, 1 - length / 600 - depth / 10), 2), "token_accuracy": 1.0,
             "count": 20, "seed": 1, "chance": 1e-4, "passkey_fraction": 0.5, "step": step}
            for length in lengths for depth in depths]


def attention_records(step: int = 10, length: int = 256, layers: int = 2, heads: int = 4) -> list[dict]:
    bins = [[0, 0], [1, 3], [4, 15], [16, 63], [64, 255]]
    values = (np.arange(layers * heads * len(bins), dtype=float).reshape(layers, heads, len(bins)) / 4).tolist()
    return [{"scheme": "alibi", "train_length": 64, "eval_length": length, "split": "valid", "windows": 2,
             "block": 8, "layers": layers, "heads": heads, "positions": bins, "mean_distance": values,
             "entropy": values, "step": step}]


def full_run(root: pathlib.Path, name: str, scheme: str = "alibi", ppl: dict | None = None,
             attention: bool = True) -> pathlib.Path:
    """A byte-level run folder with perplexity and passkey records, and attention ones (`attention`)."""
    path = fake_run(root, scheme, 64, "/data/mycorpus", ppl or {64: 5.0, 128: 5.1, 256: 5.3, 512: 5.6},
                    tokenizer="byte", name=name)
    (path / "eval" / "passkey.json").write_text(json.dumps(passkey_records()))
    if attention:
        (path / "eval" / "attention.json").write_text(json.dumps(attention_records()))
    return path
