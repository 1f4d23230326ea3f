"""Demo: byte-level decoders on the built-in corpus (Python's bundled documentation), sized for
2 CPU cores. Trained at L = 64, evaluated at L, 2L, 4L, 8L, 16L.

    python train.py --config configs/demo.py:alibi --workdir runs/demo/alibi
    python sweep.py --config configs/demo.py --schemes sinusoidal,rope,alibi,t5,nope --workdir runs/demo

Expected (see README, measured on 2 CPU cores): ALiBi's perplexity stays flat (within a few per
cent) from L to 16L; sinusoidal's rises several-fold by 8L; RoPE falls between them.
"""
import ml_collections

import posenc


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg`: the positional scheme (default alibi)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.data = dict(source="builtin", name="python_docs", path="", hf_config="", text_column="text",
                  tokenizer="byte", vocab_size=0, train_split="train",
                  passkey_fraction=0.0, passkey_digits=4)  # share of training rows that are passkey examples
    c.model = dict(num_layers=4, d_model=128, num_heads=4, mlp_dim=512, activation="gelu",
                   dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                   tie_embeddings=True, adaptive_cutoffs=(), adaptive_factor=4, adaptive_tail_capacity=0.25,
                   attention="auto", attention_block=512, dtype="float32")
    c.posenc = posenc.default_config(arg or "alibi")
    c.train = dict(seq_len=64, batch_size=32, steps=600, optimizer="adamw", lr=2e-3, warmup_steps=100,
                   warmup_init_lr=0.0, min_lr_ratio=0.1, weight_decay=0.1, b1=0.9, b2=0.98, momentum=0.9,
                   grad_clip=1.0, device_batch_tokens=0,  # 0: the whole update in one step per device
                   log_every=50, checkpoint_every=200,
                   init_from="", init_step=0,  # start from another run's parameters (0: its newest step)
                   dropout_rng="threefry")  # the dropout masks' PRNG: threefry | rbg | unsafe_rbg
    c.mesh = dict(fsdp=1)  # devices that shard parameters and optimizer state (1: replicated)
    # What train.py, sweep.py and eval_extrapolate.py evaluate (their flags override it);
    # overrides: eval-time options, "posenc.rope.yarn_scale=4,model.attention=blockwise".
    c.eval = dict(lengths=(), length_multipliers=(1, 2, 4, 8, 16), stride=0, split="valid",
                  batch_tokens=16384, max_tokens=0, overrides="")
    return c
