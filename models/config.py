"""The decoder's config, `ModelConfig`, and the names its options take, free of JAX (config code and
reports read it without loading the model): models/decoder.py maps the names to JAX (activation
functions, dtypes), models/attention/ implements the attention paths named here.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from posenc import domains
from posenc.domains import at_least, one_of, only_with, positive, satisfies, unit_interval

# "gelu" is the tanh approximation (HF's gelu_new / gelu_pytorch_tanh), "gelu_exact" the erf form (HF's gelu)
ACTIVATION_NAMES = ("relu", "gelu", "gelu_exact", "silu")  # models/decoder.py: ACTIVATIONS
DTYPE_NAMES = ("float32", "bfloat16")                      # models/decoder.py: DTYPES
NORMS = ("layernorm", "layernorm_nobias", "rmsnorm")
MLPS = ("plain", "gated")
# model.attention: `auto`'s choice or a row of models/attention/paths.py (whose table says what each is)
ATTENTION_PATHS = ("auto", "dense", "triangular", "blockwise", "fused", "pallas", "cpu_flash")
DEFAULT_PATH = "auto"
DEFAULT_BLOCK = 512  # tile width of blockwise attention (and of the MLP, evaluating long)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape and options; `from_config(section, vocab_size)` builds and checks it
    from a config's `model` section.

    - vocabulary: `vocab_size` (0 until the tokenizer is known; `from_config` sets it).
    - shape: `num_layers`, `d_model`, `num_heads` (head size d_model / num_heads), `mlp_dim`,
      `activation`.
    - regularisation: three dropout rates, where `Block` and `Attention` say.
    - input and output layers: `tie_embeddings`, and adaptive input / softmax (`adaptive_*`,
      models/adaptive.py) for large word vocabularies.
    - attention implementation: `attention` (a path of models/attention/paths.py, or `auto`),
      `attention_block`, the tile width of the long-sequence paths, `attention_check` (the fused
      kernels' numerical check on the device); `attention_sinks`, `attention_window` and
      `attention_sink_distance`, LM-Infinite's Lambda mask (an evaluation option for any scheme); the
      window alone is a sliding window (the last W keys, Mistral's `sliding_window`).
    - numerics: `dtype`, the compute dtype; parameters stay float32 (models/hf.py may load them
      in bfloat16).
    - the block (defaults: this project's block, as fairseq's; models/hf.py sets them for Llama,
      Mistral, Qwen2 and GPT-NeoX, and any run may train with them from scratch):
      `norm` (layernorm | layernorm_nobias | rmsnorm) with `norm_eps`; `mlp` ("plain":
      fc2(act(fc1 x)); "gated": fc2(act(gate x) * fc1 x), SwiGLU with activation silu);
      `num_kv_heads` (grouped-query attention: k and v have this many heads, each serving
      num_heads / num_kv_heads query heads; 0 = num_heads) and `head_dim` (0 = d_model / num_heads);
      biases of the q/k/v projection (`qkv_bias`), the attention output (`out_bias`) and the MLP
      (`mlp_bias`); `scale_embeddings` (x sqrt(d_model) as fairseq; Hugging Face models do not);
      `parallel_residual` (GPT-NeoX: x + attn(ln1 x) + mlp(ln2 x) instead of two residual steps);
      Gemma 3's block: `qk_norm` (q and k normed per head before the scheme), `post_norms` (the
      attention's and the MLP's outputs normed before the residual), and windowed layers with a global
      one every `global_every` layers, whose RoPE base is `local_rope_base`.
    """

    vocab_size: int = 0
    num_layers: int = 4
    d_model: int = 128
    num_heads: int = 4
    mlp_dim: int = 512
    activation: str = "gelu"
    dropout: float = 0.0            # on embeddings, attention output and MLP output
    attention_dropout: float = 0.0  # on attention probabilities
    activation_dropout: float = 0.0 # inside the MLP
    tie_embeddings: bool = True
    adaptive_cutoffs: tuple = ()    # e.g. (20000, 60000): adaptive input + adaptive softmax
    adaptive_factor: int = 4        # band i has width d_model / factor**i
    adaptive_tail_capacity: float = 0.25  # training scores a tail cluster in this fraction of each row's
                                    # positions (the tokens whose target it holds); a batch with a row
                                    # needing more scores it for every token. 0: every token always
    attention: str = DEFAULT_PATH   # auto | dense | triangular | blockwise | fused | pallas | cpu_flash: how `auto`
                                    # chooses: models/attention/choice.py; what each is: paths.py
    attention_block: int = DEFAULT_BLOCK  # tile size of blockwise attention (and of the MLP, evaluating long)
    attention_check: bool = True    # an explicit fused kernel (pallas, fused) must pass its numerical check
                                    # on the device first (models/attention/verify.py); off: benchmarking only
    attention_sinks: int = 0        # LM-Infinite's Lambda mask (models/attention/lambda_mask.py): the first
                                    # tokens every query also sees beyond its window, as if from distance W
    attention_window: int = 0       # ... and each query's local window, the last W keys (0: the training
                                    # length L where sinks are set); sinks 0 and a window: a sliding window
                                    # (Mistral's sliding_window); both 0: plain causal attention. No
                                    # parameters: switchable with --set
    attention_sink_distance: int = 0  # ... the distance the sinks beyond the window are seen at (the authors'
                                    # limit_distance): 0, the window W (their convert_llama_model); set it to L
                                    # for this project's form before issue 34 (the same wherever W = L)
    dtype: str = "float32"          # compute dtype; parameters stay float32
    norm: str = "layernorm"         # layernorm | layernorm_nobias | rmsnorm
    norm_eps: float = 1e-6          # epsilon of every norm
    mlp: str = "plain"              # plain | gated (gate, up = fc1, down = fc2)
    num_kv_heads: int = 0           # key/value heads (grouped-query attention); 0 = num_heads
    head_dim: int = 0               # features per head; 0 = d_model / num_heads
    qkv_bias: bool = True           # bias of the q, k, v projections
    out_bias: bool = True           # bias of the attention output projection
    mlp_bias: bool = True           # biases of the MLP's projections
    scale_embeddings: bool = True   # embeddings x sqrt(d_model)
    parallel_residual: bool = False # x + attn(ln1 x) + mlp(ln2 x)
    qk_norm: bool = False           # a norm over each head's features of q and k, before the positional scheme
    post_norms: bool = False        # a norm of the attention's and the MLP's output before each residual addition
    global_every: int = 0           # with attention_window: every N-th layer (N-1, 2N-1, ...) sees all keys, the
                                    # others the window (Gemma 3: 6); 0: every layer as attention_window says
    local_rope_base: float = 0.0    # with global_every: the RoPE base of the windowed layers, which keep plain
                                    # RoPE whatever the scheme's scaling (Gemma 3: 10,000); 0: the scheme's
    # Each option's values (posenc/domains.py; `check_block` checks how they combine).
    DOMAINS = {"num_layers": at_least(1), "d_model": at_least(1), "num_heads": at_least(1), "mlp_dim": at_least(1),
               "activation": one_of(*ACTIVATION_NAMES), "dropout": unit_interval(hi_open=True),
               "attention_dropout": unit_interval(hi_open=True), "activation_dropout": unit_interval(hi_open=True),
               "adaptive_cutoffs": satisfies(lambda v, _: all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                                                              for c in v) and list(v) == sorted(set(v)),
                                             "increasing whole numbers >= 1, e.g. 20000,60000 (() = off)", ()),
               "adaptive_factor": at_least(1), "adaptive_tail_capacity": unit_interval(note="0: every token always"),
               "attention": one_of(*ATTENTION_PATHS), "attention_block": at_least(1), "dtype": one_of(*DTYPE_NAMES),
               "norm": one_of(*NORMS), "norm_eps": positive(), "mlp": one_of(*MLPS),
               "num_kv_heads": at_least(0, note="0 = num_heads"),
               "head_dim": at_least(0, note="0 = d_model / num_heads"),
               "attention_sinks": at_least(0, note="0 = off"),
               "attention_window": at_least(0, note="0 = none, or the training length with sinks"),
               "attention_sink_distance": only_with(lambda o: o["attention_sinks"], "model.attention_sinks",
                                                    at_least(0, note="0 = the window"), 0),
               "global_every": at_least(0, note="0 = every layer as attention_window says"),
               "local_rope_base": at_least(0, note="0 = the scheme's base")}

    @property
    def head_size(self) -> int:
        """Features per head: `head_dim`, or d_model / num_heads."""
        return self.head_dim or self.d_model // self.num_heads

    def windowed(self, layer: int) -> bool:
        """Whether layer `layer` (from 0) attends within `attention_window` (not a global layer)."""
        return bool(self.attention_window) and not (self.global_every and (layer + 1) % self.global_every == 0)

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `num_kv_heads`, or num_heads."""
        return self.num_kv_heads or self.num_heads

    @classmethod
    def from_config(cls, model_cfg: Any, vocab_size: int) -> "ModelConfig":
        fields = {f.name for f in dataclasses.fields(cls)} - {"vocab_size"}
        given = dict(model_cfg)
        unknown = set(given) - fields
        if unknown:
            raise ValueError(f"unknown model option(s) {sorted(unknown)}; valid: {sorted(fields)}")
        if isinstance(given.get("adaptive_cutoffs"), list):  # config.json reads tuples back as lists
            given["adaptive_cutoffs"] = tuple(given["adaptive_cutoffs"])
        domains.check(cls, given, "model")
        cfg = cls(vocab_size=vocab_size, **given)
        if cfg.adaptive_cutoffs and cfg.adaptive_cutoffs[-1] >= vocab_size:
            raise ValueError(f"model.adaptive_cutoffs={cfg.adaptive_cutoffs} must lie below the vocabulary "
                             f"size {vocab_size}; lower them or use a larger vocabulary")
        cfg.check_block()
        return cfg

    def check_block(self) -> None:
        """Refuse block options that have no meaning (ValueError naming the option)."""
        if self.d_model % self.num_heads and not self.head_dim:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}; "
                             f"set model.head_dim")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"model.num_heads={self.num_heads} is not divisible by model.num_kv_heads={self.kv_heads}")
        if self.global_every and not self.attention_window:
            raise ValueError(f"model.global_every={self.global_every} makes every {self.global_every}th layer global "
                             f"among windowed ones; it needs model.attention_window (the other layers' window)")
        if self.local_rope_base and not self.global_every:
            raise ValueError(f"model.local_rope_base={self.local_rope_base} is the base of the windowed layers beside "
                             f"global ones; it needs model.global_every and model.attention_window")
        for name, valid in (("activation", ACTIVATION_NAMES), ("attention", ATTENTION_PATHS),
                            ("dtype", DTYPE_NAMES), ("norm", NORMS), ("mlp", MLPS)):
            if getattr(self, name) not in valid:
                raise ValueError(f"unknown model.{name} {getattr(self, name)!r}; valid: {', '.join(valid)}")
