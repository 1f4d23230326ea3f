"""The CPU's flash-attention kernel (models/attention/cpu_flash.py, native/flash_attention.cc): equal to
attention computed in float64 over every shape it meets (odd lengths, grouped heads, windows, head
sizes apart from the vector width), through the decoder for every scheme its row accepts, causal,
differentiable; `auto` takes it for long forward passes only; what it cannot compute is refused with
the option that fixes it; and a machine without a compiler keeps XLA's paths."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from models import DecoderLM
from models.attention import choice, cpu_flash, native, paths
from models.config import ModelConfig
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(native.unavailable() is not None, reason=f"no CPU kernel: {native.unavailable()}")


def reference(q, k, v, scale, window=0):
    """Causal softmax attention in float64 (grouped keys and values repeated)."""
    return attend(reference_logits(q, k, scale), v, window)


def attend(s, v, window=0):
    """Causal softmax of float64 logits B x H x T x T (and a sliding window) over v (grouped heads repeated)."""
    t = s.shape[-1]
    v = np.repeat(np.asarray(v, np.float64), s.shape[1] // v.shape[2], 2)
    i = np.arange(t)
    allowed = i[:, None] >= i[None, :]
    if window:
        allowed &= i[:, None] - i[None, :] < window
    s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhts,bshk->bthk", p / p.sum(-1, keepdims=True), v)


def qkv(b, t, h, g, d, dv, seed=0, spread=2.0):
    r = np.random.default_rng(seed)
    return (jnp.asarray(r.standard_normal((b, t, h, d)) * spread, jnp.float32),
            jnp.asarray(r.standard_normal((b, t, g, d)) * spread, jnp.float32),
            jnp.asarray(r.standard_normal((b, t, g, dv)), jnp.float32))


# (rows, length, query heads, key-value heads, q / k features, v features, window)
SHAPES = [(1, 1, 2, 1, 8, 8, 0), (2, 7, 4, 2, 16, 8, 0), (1, 515, 9, 3, 64, 64, 0), (2, 300, 4, 4, 32, 40, 0),
          (1, 700, 6, 2, 128, 64, 300), (1, 300, 4, 1, 256, 256, 64), (1, 200, 2, 2, 64, 64, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}t{}h{}g{}d{}v{}w{}".format(*s))
@pytest.mark.parametrize("blocks", [(128, 256), (7, 64 * 3)], ids=["128x256", "7x192"])
def test_the_kernel_equals_attention_in_float64(shape, blocks):
    """Query blocks longer and shorter than the sequence, key blocks of several panels, a last block
    of both cut short; grouped-query keys read in place; v with more or fewer features than q."""
    b, t, h, g, d, dv, window = shape
    if blocks[1] % native.panel_width():
        pytest.skip(f"keys per block not a multiple of this build's panel width {native.panel_width()}")
    q, k, v = qkv(b, t, h, g, d, dv)
    got = jax.jit(lambda q, k, v: cpu_flash.flash(q, k, v, d ** -0.5, window, blocks))(q, k, v)
    assert got.shape == (b, t, h, dv) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, reference(q, k, v, d ** -0.5, window), atol=2e-5, rtol=1e-5)


def test_the_kernel_is_as_exact_as_xla():
    """Its largest error against float64 is no larger than XLA's dense float32 attention's (the
    exponential it computes is within about 1.3 float32 ulps)."""
    q, k, v = qkv(1, 1100, 6, 2, 64, 64, seed=3, spread=3.0)
    exact = reference(q, k, v, 64 ** -0.5)
    ours = np.abs(np.asarray(cpu_flash.flash(q, k, v, 64 ** -0.5), np.float64) - exact).max()
    xla = np.abs(np.asarray(jax.jit(cpu_flash._reference, static_argnums=(3, 4))(q, k, v, 64 ** -0.5, 0),
                            np.float64) - exact).max()
    assert ours <= 1.5 * xla, (ours, xla)


def test_the_kernel_is_causal():
    """The output at t does not depend on keys or values after t: changing them changes nothing, bitwise."""
    q, k, v = qkv(1, 700, 4, 2, 32, 32, seed=1)
    out = cpu_flash.flash(q, k, v, 32 ** -0.5)
    k2, v2 = k.at[:, 400:].set(7.0), v.at[:, 400:].set(-3.0)
    out2 = cpu_flash.flash(q, k2, v2, 32 ** -0.5)
    np.testing.assert_array_equal(out[:, :400], out2[:, :400])
    assert not np.allclose(out[:, 400:], out2[:, 400:])


def test_gradients_through_the_kernel_are_blockwise_attentions():
    q, k, v = qkv(1, 300, 4, 2, 16, 16, seed=2)

    def loss(f):
        return lambda q, k, v: (f(q, k, v) ** 2).sum()
    ours = jax.grad(loss(lambda q, k, v: cpu_flash.flash(q, k, v, 0.25, 100)), argnums=(0, 1, 2))(q, k, v)
    theirs = jax.grad(loss(lambda q, k, v: cpu_flash._reference(q, k, v, 0.25, 100)), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


CFG = dict(vocab_size=37, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64, attention_block=16)


def _accepted(name: str) -> bool:
    spec = paths.CallSpec(name, 64, 8, "float32")
    return paths.PATHS["cpu_flash"].accepts(posenc.get(name).traits, spec) is None


@pytest.mark.parametrize("name", [n for n in posenc.names() if _accepted(n)])
def test_the_decoder_gives_blockwise_logits_with_the_kernel(name):
    """Every scheme the row accepts (rotations, absolute embeddings, NoPE, log-n's per-query scale),
    with grouped-query heads: the same logits as blockwise attention, 70 tokens in tiles of 16."""
    models = [DecoderLM(ModelConfig(**CFG, attention=path), posenc.default_config(name), train_length=80,
                        rngs=nnx.Rngs(0)) for path in ("cpu_flash", "blockwise")]
    x = jax.random.randint(jax.random.key(0), (2, 70), 0, CFG["vocab_size"])
    np.testing.assert_allclose(models[0](x), models[1](x), atol=2e-5, rtol=1e-5)


def test_a_sliding_window_gives_blockwise_logits():
    """A windowed model (Mistral's sliding window: the Lambda mask without sinks)."""
    models = [DecoderLM(ModelConfig(**CFG, attention=path, attention_window=20), posenc.default_config("rope"),
                        train_length=32, rngs=nnx.Rngs(0)) for path in ("cpu_flash", "blockwise")]
    x = jax.random.randint(jax.random.key(1), (1, 90), 0, CFG["vocab_size"])
    np.testing.assert_allclose(models[0](x), models[1](x), atol=2e-5, rtol=1e-5)



def reference_moved(qs, ks, v, q_coord, k_coord, thresholds, scale, window=0):
    """Attention in float64 whose pair (t, j) takes its logit from variant #{thresholds reached by
    q_coord[t] - k_coord[j]} of q and k."""
    logits = [reference_logits(q, k, scale) for q, k in zip(qs, ks)]
    apart = np.asarray(q_coord)[:, :, None] - np.asarray(k_coord)[:, None, :]
    picked = sum((apart >= th).astype(int) for th in thresholds)[:, None]
    return attend(np.choose(np.broadcast_to(picked, logits[0].shape), logits), v, window)


def reference_logits(q, k, scale):
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    return np.einsum("bthk,bshk->bhts", q, np.repeat(k, q.shape[2] // k.shape[2], 2)) * scale


def moved(b, t, h, g, d, rule, seed=0):
    """q, k, v and Moves of a Self-Extend-like rule (2 variants, positions as coordinates, one
    threshold) or a DCA-like one (3 variants, chunks of 90 as coordinates, thresholds 1 and 2)."""
    q, k, v = qkv(b, t, h, g, d, d, seed)
    extra = [qkv(b, t, h, g, d, d, seed + 1 + i)[:2] for i in range(1 if rule == "self_extend" else 2)]
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    coords, thresholds = (pos, (150,)) if rule == "self_extend" else (pos // 90, (1, 2))
    return q, k, v, cpu_flash.Moves(tuple(e[0] for e in extra), tuple(e[1] for e in extra), coords, coords,
                                    thresholds)


@pytest.mark.parametrize("rule", ["self_extend", "dca"])
@pytest.mark.parametrize("blocks,window", [((128, 256), 0), ((7, 64 * 3), 0), ((32, 64 * 2), 250)],
                         ids=["128x256", "7x192", "32x128-window"])
def test_moved_positions_equal_attention_in_float64(rule, blocks, window):
    """Blocks of keys wholly in one variant (computed as without moves) and blocks across a threshold
    (each entry from its own variant), grouped heads, a sliding window."""
    if blocks[1] % native.panel_width():
        pytest.skip(f"keys per block not a multiple of this build's panel width {native.panel_width()}")
    q, k, v, moves = moved(2, 700, 4, 2, 32, rule)
    got = jax.jit(lambda q, k, v: cpu_flash.flash(q, k, v, 32 ** -0.5, window, blocks, moves))(q, k, v)
    want = reference_moved((q, *moves.qs), (k, *moves.ks), v, moves.q_coord, moves.k_coord, moves.thresholds,
                           32 ** -0.5, window)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


MOVES = {"self_extend": dict(self_extend_window=20, self_extend_group=3),
         "dca": dict(dca_chunk_size=24, dca_local_window=4), "rerope": dict(rerope_window=18),
         "self_extend+yarn": dict(self_extend_window=8, self_extend_group=2, yarn_scale=2.0)}


def _rope(options: dict):
    cfg = posenc.default_config("rope")
    cfg.rope.update(options)
    return cfg


@pytest.mark.parametrize("method", MOVES)
def test_methods_that_move_positions_give_blockwise_logits_with_the_kernel(method):
    """Self-Extend, DCA, ReRoPE (and with YaRN) through the decoder: their `position_variants` in the
    kernel give the logits of their `bias` in blockwise attention."""
    models = [DecoderLM(ModelConfig(**CFG, attention=path), _rope(MOVES[method]), train_length=32,
                        rngs=nnx.Rngs(0)) for path in ("cpu_flash", "blockwise")]
    x = jax.random.randint(jax.random.key(0), (2, 170), 0, CFG["vocab_size"])
    np.testing.assert_allclose(models[0](x), models[1](x), atol=2e-5, rtol=1e-5)


def test_gradients_with_moved_positions_are_blockwise_attentions():
    from models.attention.blockwise import blockwise_call
    from models.attention.call import Call
    dims = posenc.ModelDims(d_model=64, num_heads=4, head_dim=16, num_layers=1, train_length=64)
    scheme = posenc.build(_rope(MOVES["dca"]), dims, rngs=nnx.Rngs(0))
    q, k, v = qkv(1, 300, 4, 2, 16, 16, seed=2)
    pos = jnp.arange(300, dtype=jnp.int32)[None]
    call = Call(pos, pos, scheme)

    def loss(f):
        return lambda q, k, v: (f(q, k, v) ** 2).sum()
    ours = jax.jit(jax.grad(loss(lambda q, k, v: cpu_flash.cpu_flash_call(q, k, v, call)), argnums=(0, 1, 2)))(q, k, v)
    theirs = jax.jit(jax.grad(loss(lambda q, k, v: blockwise_call(q, jnp.repeat(k, 2, 2), jnp.repeat(v, 2, 2), call)),
                              argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)

def _choose(name="rope", length=1100, **options):
    return _choose_scheme(posenc.default_config(name), length, **options)


def _wrapped(rope_options: dict):
    cfg = posenc.default_config("logn")
    cfg.logn.base = "rope"
    cfg.rope.update(rope_options)
    return cfg


def _choose_scheme(posenc_cfg, length=1100, **options):
    dims = posenc.ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=1, train_length=512)
    scheme = posenc.build(posenc_cfg, dims, rngs=nnx.Rngs(0))
    cfg = ModelConfig(**{**CFG, "attention_block": 512, **options})
    positions = jnp.arange(length, dtype=jnp.int32)[None]
    return choice.choose(cfg, scheme, positions, jnp.dtype(cfg.dtype), dropping=False)


def test_auto_takes_the_kernel_for_long_forward_passes_only():
    assert _choose() == "cpu_flash"  # beyond two attention blocks, not training
    assert _choose(attention_window=600) == "cpu_flash"  # a sliding window
    assert _choose(length=1024) == "triangular"  # within two blocks: as before
    with choice.training_calls(rows=1):
        assert _choose() == "blockwise"  # differentiated: XLA's path
    assert _choose("alibi") == "blockwise"  # a bias
    assert _choose("rope", **{}) == "cpu_flash"
    se = dict(self_extend_window=256, self_extend_group=4)
    assert _choose_scheme(_rope(se)) == "cpu_flash"  # a bias of moved positions: the kernel's variants
    assert _choose_scheme(_wrapped(se)) == "blockwise"  # wrapped (log-n around it): not taken apart
    assert _choose(attention_sinks=4) == "blockwise"  # LM-Infinite's sinks
    assert _choose(dtype="bfloat16") == "blockwise"


def test_the_kernel_refuses_what_it_cannot_compute():
    refusal = lambda name, **kw: paths.PATHS["cpu_flash"].accepts(
        posenc.get(name).traits, paths.CallSpec(name, 64, 8, kw.pop("dtype", "float32"), **kw))
    assert "computes q . k alone" in refusal("alibi")
    assert "attention=dense" in refusal("rope", dropping=True)
    assert "sinks" in refusal("rope", masked=True, sinks=True)
    assert "--config.model.dtype=float32" in refusal("rope", dtype="bfloat16")
    assert refusal("rope", masked=True) is None  # a sliding window
    with pytest.raises(ValueError, match="model.attention=cpu_flash"):
        _choose("t5", attention="cpu_flash")


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_a_machine_without_a_compiler_keeps_xla_paths(tmp_path):
    """No compiler on PATH (and none named by CXX): one line says why, `auto` takes blockwise, and an
    explicit cpu_flash is refused with that reason."""
    code = ("from models.attention import native, cpu_flash, paths; import posenc\n"
            "print(native.unavailable())\n"
            "print(cpu_flash.usable())\n"
            "print(paths.PATHS['cpu_flash'].accepts(posenc.get('rope').traits, paths.CallSpec('rope', 64, 8, 'float32')))")
    env = {"PATH": str(tmp_path), "LX_KERNEL_CACHE": str(tmp_path / "cache")}
    env.pop("CXX", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**{k: v for k, v in os.environ.items() if k != "CXX"}, **env})
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[0].startswith("no C++ compiler found") and lines[1] == "False"
    assert lines[2].startswith("model.attention=cpu_flash: no C++ compiler found") and "use auto" in lines[2]
    assert _python("from models.attention import native; print(native.unavailable())",
                   LX_CPU_KERNELS="0").stdout.startswith("LX_CPU_KERNELS=0")


def test_concurrent_processes_build_one_library(tmp_path):
    """Two processes building at once into an empty folder (test workers): both load it, one library
    is kept, no partial file is left."""
    code = "from models.attention import native; print(native.unavailable(), native.panel_width())"
    env = {**os.environ, "LX_KERNEL_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(out.split()[0] == "None" for out in outs), outs
    assert len(list(tmp_path.glob("flash_attention-*.so"))) == 1 and not list(tmp_path.glob("*partial*"))


def test_block_sizes_are_searched_once_per_machine(tmp_path, monkeypatch):
    """The search keeps its choice and every candidate's time on disk; LX_CPU_FLASH_BLOCKS fixes them
    and is checked."""
    monkeypatch.setattr(cpu_flash, "_BLOCKS", {})
    monkeypatch.setattr(native, "cache_folder", lambda: tmp_path)
    monkeypatch.setattr(cpu_flash, "SEARCH_LENGTH", 256)
    blocks = cpu_flash.search_blocks(4, 2, 16, 16)
    (saved,) = tmp_path.glob("flash_blocks-*.json")
    entry = json.loads(saved.read_text())["h4g2d16v16"]
    assert tuple(entry["blocks"]) == blocks in cpu_flash.CANDIDATES and len(entry["ms"]) >= 2
    monkeypatch.setattr(cpu_flash, "_BLOCKS", {})
    monkeypatch.setattr(cpu_flash, "_time_candidates", lambda *a: pytest.fail("searched again"))
    assert cpu_flash.search_blocks(4, 2, 16, 16) == blocks  # from disk
    monkeypatch.setenv("LX_CPU_FLASH_BLOCKS", "32x512")
    assert cpu_flash.search_blocks(4, 2, 16, 16) == (32, 512)  # (any multiple of the panel width)
    monkeypatch.setenv("LX_CPU_FLASH_BLOCKS", "32")
    with pytest.raises(ValueError, match="LX_CPU_FLASH_BLOCKS"):
        cpu_flash.search_blocks(4, 2, 16, 16)


def test_the_path_is_listed_where_paths_are():
    assert "cpu_flash" in paths.PATHS and paths.PATHS["cpu_flash"].grouped
    assert choice.AUTO_ORDER.index("cpu_flash") < choice.AUTO_ORDER.index("blockwise")
    row = paths.PATHS["cpu_flash"]
    assert row.tile(512) == 512 and not row.xla and not row.baseline
