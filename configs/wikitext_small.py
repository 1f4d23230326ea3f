"""Reduced-scale reproduction of Press et al. (2022) on real WikiText text, sized for 2 CPU cores.

Only WikiText's validation and test splits are at hand here (../shared/data/wikitext): the model
trains on the validation split of WikiText-103 (raw) and is evaluated on its test split, byte-level
(token and word-level perplexity both reported). Arg: the positional scheme (default alibi).

    python sweep.py --config configs/wikitext_small.py --schemes sinusoidal,rope,t5,alibi \
        --workdir runs/wikitext_small
    (the full recipe, with the sliding-window evaluation: results/wikitext_small/README.md)

Expected shape (results/wikitext_small/ppl_vs_length.md): sinusoidal perplexity several times
higher at 16L than at L; ALiBi flat; RoPE and T5 between them.
"""
import pathlib

import ml_collections

from configs import demo

SHARED_WIKITEXT = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = demo.get_config(arg)
    c.data.update(dict(source="local", path=str(SHARED_WIKITEXT / "wikitext-103-raw"), tokenizer="byte",
                       train_split="valid"))
    c.train.update(dict(steps=1000, checkpoint_every=250))
    c.eval.update(dict(split="test", max_tokens=262_144))
    return c
