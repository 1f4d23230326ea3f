"""Press, Smith & Lewis (ICLR 2022), "Train Short, Test Long", WikiText-103 experiment.

Variants: `configs/wikitext103.py:SCHEME,L` (default `alibi,512`), SCHEME in sinusoidal, rope, t5,
alibi (or any registered scheme), L the training length (the paper: 512, 1024, 3072; Table 5 also
trains ALiBi at 64 ... 3072).

    python train.py --config configs/wikitext103.py:alibi,512 --workdir runs/wt103/alibi_L512
    python sweep.py --config configs/wikitext103.py --schemes sinusoidal,rope,t5,alibi \
        --train_lengths 512,1024,3072 --workdir runs/wt103
    # offline: point at a local copy of the three splits (wiki.{train,valid,test}.tokens)
    ... --config.data.source=local --config.data.path=/data/wikitext-103

On 1, 2, 4 or 8 GPUs the same command trains with the paper's update (docs/scale.md):
train.device_batch_tokens = 9216 splits it into micro-steps. `configs/wikitext103.py:alibi,512,1.3b`
is the appendix's larger model (25 layers, d = 2048, 16 heads, FFN 8192, 1.3B parameters).

The model (247M parameters at the WikiText-103 vocabulary): 16 layers, d = 1024, 8 heads,
FFN 4096, ReLU, pre-LayerNorm, dropout 0.3 / attention 0.1 / activation 0.1, word-level vocabulary
of the train split, tied adaptive input + adaptive softmax (cutoffs 20000, 60000; factor 4).
Training: NAG (momentum 0.99), lr 1.0 with 16k warm-up from 1e-7, cosine to 1e-4 over 270k
updates (286k in all), gradient clipping 0.1, 9216 tokens per GPU per update on 8 GPUs
(train.batch_size = 8 * 9216 / L sequences, global). Evaluation: nonoverlapping on the validation
split at the paper's L_valid (L, L+1, L+10, ..., L+15000, then 1024 ... 3072).

Expected validation perplexity (Press et al. 2022, Table 2, L = 512; all numbers in
experiment/data/press2022_wikitext103_valid.csv, which report.py overlays):
    L_valid:       512     1012     2512     5512    15512
    sinusoidal   20.05    43.54   132.41   240.44   406.01
    rotary       20.07    21.37    31.58    43.14    79.25
    t5           19.65    18.79    20.41    29.54      OOM
    alibi        19.73    18.73    18.41    18.36    18.31
"""
import ml_collections

from experiment.config import arg_count, defaults
from experiment.report import paper

TOKENS_PER_DEVICE = 9216
DEVICES = 8


def paper_eval_lengths(train_length: int) -> tuple[int, ...]:
    """The L_valid values of the paper's tables for this training length (nonoverlapping); a tuple,
    as --config.eval.lengths=... overrides only tuples."""
    lengths = sorted({r["eval_length"] for r in paper.rows()
                      if r["train_length"] == train_length and r["stride"] == r["eval_length"]})
    return tuple(lengths or [train_length * m for m in (1, 2, 4, 8, 16)])


# The appendix's larger model (1.3B parameters): `configs/wikitext103.py:alibi,512,1.3b`.
SIZES = {"247m": dict(num_layers=16, d_model=1024, num_heads=8, mlp_dim=4096),
         "1.3b": dict(num_layers=25, d_model=2048, num_heads=16, mlp_dim=8192)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg`: SCHEME[,L[,SIZE]], SIZE 247m (default) or 1.3b."""
    scheme, length, size = ((arg or "alibi,512").split(",") + ["", ""])[:3]
    train_length = arg_count(length, 512, part="the training length L (after the scheme)",
                             spec=f"configs/wikitext103.py:{arg}", example=f"configs/wikitext103.py:{scheme},512")
    size = (size or "247m").lower()
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r} in configs/wikitext103.py:{arg}; valid: {', '.join(SIZES)}")
    c = defaults(scheme)
    c.seed = 1
    c.data.update(dict(source="hf", name="Salesforce/wikitext", hf_config="wikitext-103-v1", tokenizer="word"))
    c.model.update(dict(**SIZES[size], activation="relu", dropout=0.3, attention_dropout=0.1,
                        activation_dropout=0.1, adaptive_cutoffs=(20000, 60000), dtype="bfloat16"))
    # 1 device: 8 micro-steps of 9,216 tokens per update; 8 devices: one each. mesh.fsdp = N shards
    # parameters and optimizer state N ways (1: replicated).
    c.train.update(dict(seq_len=train_length, batch_size=max(1, DEVICES * TOKENS_PER_DEVICE // train_length),
                        steps=286_000, optimizer="nag", lr=1.0, momentum=0.99, warmup_steps=16_000,
                        warmup_init_lr=1e-7, min_lr_ratio=1e-4, weight_decay=0.0, grad_clip=0.1,
                        device_batch_tokens=TOKENS_PER_DEVICE, log_every=100, checkpoint_every=2000))
    c.eval.update(dict(lengths=paper_eval_lengths(train_length), length_multipliers=(1,)))
    return c
