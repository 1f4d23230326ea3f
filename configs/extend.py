"""Context extension at demo scale: a RoPE run trained at L, fine-tuned briefly at 4L from its
parameters (a fresh optimizer), with position interpolation (Chen et al. 2023), YaRN (Peng et al.
2023) or plain RoPE, then evaluated at L ... 16L beside the base.

    python train.py --config configs/demo.py:rope --workdir runs/extend/base           # the base, L = 64
    python sweep.py --config configs/extend.py:pi,runs/extend/base --schemes rope \
        --grid train.steps=25,100 --workdir runs/extend/pi                              # PI, 4L = 256
    python sweep.py --config configs/extend.py:yarn,runs/extend/base --schemes rope \
        --grid train.steps=25,100 --workdir runs/extend/yarn

Arg: METHOD,BASE_WORKDIR[,FACTOR]. METHOD: pi (rope.pi_factor = 1/FACTOR), yarn (rope.yarn_scale =
FACTOR from the base's length, `rope.original_length`), or plain (no rescaling). FACTOR default 4;
no arg means yarn,runs/extend/base.
The recipe of both papers, scaled down: a few hundred steps (PI: 1,000 for LLaMA; YaRN: 400), a
small learning rate, the base's data. The committed result: results/context_extension/.
"""
import ml_collections

from configs import demo

METHODS = ("pi", "yarn", "plain")
DEFAULT_ARG = "yarn,runs/extend/base"  # the README's commands


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    method, _, rest = (arg or DEFAULT_ARG).partition(",")
    base, _, factor = rest.partition(",")
    if method not in METHODS or not base:
        raise ValueError(f"configs/extend.py needs METHOD,BASE_WORKDIR[,FACTOR] with METHOD one of "
                         f"{', '.join(METHODS)}, got {arg!r}")
    factor = int(factor or 4)
    c = demo.get_config("rope")
    base_length = c.train.seq_len
    c.posenc.rope.original_length = base_length
    c.train.update(dict(seq_len=factor * base_length, batch_size=8, steps=100, lr=5e-4, warmup_steps=5,
                        min_lr_ratio=1.0, log_every=25, checkpoint_every=100, init_from=base))
    # The factor is the new length over the base's, tied to train.seq_len (a FieldReference), so that
    # --config.train.seq_len=128 or sweep.py --train_lengths 128 scale by 2, not by FACTOR.
    target = c.train.get_ref("seq_len").to_float()
    if method == "pi":
        c.posenc.rope.pi_factor = base_length / target
    elif method == "yarn":
        c.posenc.rope.yarn_scale = target / base_length
    c.eval.update(dict(lengths=tuple(base_length * m for m in (1, 2, 4, 8, 16))))
    return c
