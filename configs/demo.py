"""Demo: byte-level decoders on the built-in corpus (Python's bundled documentation), sized for
2 CPU cores. Trained at L = 64, evaluated at L, 2L, 4L, 8L, 16L.

    python train.py --config configs/demo.py:alibi --workdir runs/demo/alibi
    python sweep.py --config configs/demo.py --schemes sinusoidal,rope,alibi,t5,nope --workdir runs/demo

The demo is the typed defaults themselves (experiment/config.py): 4 layers, d = 128, 4 heads,
AdamW at 2e-3, 600 steps of 32 x 64 tokens. Expected (see README, measured on 2 CPU cores):
ALiBi's perplexity stays flat (within a few per cent) from L to 16L; sinusoidal's rises
several-fold by 8L; RoPE falls between them.
"""
import ml_collections

from experiment.config import defaults


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg`: the positional scheme (default alibi)."""
    return defaults(arg or "alibi")
