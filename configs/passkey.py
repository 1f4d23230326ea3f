"""Passkey retrieval at demo scale (Mohtashami & Jaggi 2023): the demo's byte-level decoder trained at
L = 64 on the built-in corpus with half of its training rows replaced by passkey examples
(corpora/passkey.py: a 4-digit key hidden at a random depth in filler, asked for at the end), then
asked at 64 ... 1024. Arg: the positional scheme (default alibi).

    python sweep.py --config configs/passkey.py --schemes alibi,rope,nope,kerple_log --workdir runs/passkey
    python eval_extrapolate.py --workdir runs/passkey/alibi_L64 --passkey

The committed result: results/passkey/ (configs/studies/passkey.py does both steps for every scheme and seed).
"""
import ml_collections

from configs import demo


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = demo.get_config(arg)
    c.data.update(dict(passkey_fraction=0.5, passkey_digits=4))
    c.train.update(dict(steps=1500, checkpoint_every=500, log_every=100))
    return c
