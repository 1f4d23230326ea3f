"""Training-free context extension at demo scale (the survey's experiment; results/training_free/): a
decoder with Llama's block (RMSNorm, SwiGLU, grouped-query attention with 2 key/value heads, no
biases, unscaled tied embeddings) and plain RoPE, trained at L = 64 on the built-in corpus with half
of its rows passkey examples (as configs/passkey.py), so that it can be exported to Hugging Face's
format and read back, then evaluated at L ... 16L with each RoPE extension switched on at evaluation.

    python train.py --config configs/training_free.py --workdir runs/training_free/base
    python study.py configs/studies/training_free.py   # everything: train, export, re-import, evaluate,
                                                       # fine-tune, tables

4 layers, d = 128, 4 heads (head size 32), SwiGLU width 352 (3 x 128 x 352 weights per MLP, about
the demo's 2 x 128 x 512), 3,000 steps of 32 x 64 bytes: twice configs/passkey.py's 1,500, after
which this block retrieved only 9% of the keys at L (the demo's block: all of them).
"""
import ml_collections

from configs import passkey

LLAMA_BLOCK = dict(norm="rmsnorm", mlp="gated", activation="silu", mlp_dim=352, num_kv_heads=2, qkv_bias=False,
                   out_bias=False, mlp_bias=False, scale_embeddings=False)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg`: the positional scheme (default rope; only rope exports)."""
    c = passkey.get_config(arg or "rope")
    c.model.update(LLAMA_BLOCK)
    c.train.update(dict(steps=3000, checkpoint_every=500))
    return c
