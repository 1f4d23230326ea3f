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
Where BASE_WORKDIR holds a run (one trained here, or a checkpoint made a run by import_hf.py), its
model section, data section (tokenizer kind included), training length and rope options (base,
partial rotary, any scaling it has) are taken from it, so that its parameters fit: the method's
option is added to them, and the new run trains at FACTOR x the base's length. Without a run there
yet (the README's commands before the base is trained), the demo's RoPE model is assumed.

    python import_hf.py path/to/checkpoint --workdir runs/pretrained
    python train.py --config configs/extend.py:yarn,runs/pretrained --workdir runs/pretrained_yarn
The recipe of both papers, scaled down: a few hundred steps (PI: 1,000 for LLaMA; YaRN: 400), a
small learning rate, the base's data. The committed result: results/context_extension/.
"""
import pathlib

import ml_collections

from configs import demo
from experiment.config import arg_count, load_config

METHODS = ("pi", "yarn", "plain")
DEFAULT_ARG = "yarn,runs/extend/base"  # the README's commands


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    method, _, rest = (arg or DEFAULT_ARG).partition(",")
    base, _, factor = rest.partition(",")
    if method not in METHODS or not base:
        raise ValueError(f"configs/extend.py needs METHOD,BASE_WORKDIR[,FACTOR] with METHOD one of "
                         f"{', '.join(METHODS)}, got {arg!r}")
    factor = arg_count(factor, 4, part="FACTOR (after the base folder)", spec=f"configs/extend.py:{arg}",
                       example=f"configs/extend.py:{method},{base},4")
    c = demo.get_config("rope")
    saved = pathlib.Path(base) / "config.json"
    if saved.exists():
        _take_from_base(c, load_config(saved), base)
    base_length = c.train.seq_len
    c.posenc.rope.original_length = c.posenc.rope.original_length or base_length  # a scaled base keeps its own
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


def _take_from_base(c: ml_collections.ConfigDict, base_config, base: str) -> None:
    """What the fine-tune must share with its base: the model, the data, the training length, RoPE."""
    if base_config.posenc.name != "rope":
        raise ValueError(f"configs/extend.py extends a RoPE run; {base} uses {base_config.posenc.name!r}")
    saved = base_config.to_dict()
    c.model.update(saved["model"])
    c.data.update(saved["data"])
    c.posenc.rope.update(saved["posenc"]["rope"])
    c.train.seq_len = base_config.train.seq_len
    c.seed = base_config.seed
