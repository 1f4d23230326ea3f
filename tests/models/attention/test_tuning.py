"""The Pallas kernel's launch configurations per device (models/attention/tuning.py): the candidates
fit the device's shared memory for the head dimension, shapes the kernel cannot take are refused
with the reason, every kind of candidate lowers to Triton with its warps and stages, and the search,
run in the interpreter, takes the fastest configuration that passes the check, once."""
import types

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc
from models.attention import pallas, tuning, verify
from models.attention.pallas import Launch, pallas_attention

KB = 1024
A100, H100, CONSUMER = 163 * KB, 227 * KB, 99 * KB


def _need(block, head_dim, itemsize, stages, keys=None):
    """The dK / dV kernel's operands: K and V tiles, `stages` buffered Q and dO tiles, P and dS."""
    keys = keys or block
    return itemsize * (keys * head_dim * 2 + stages * block * head_dim * 2 + 2 * block * keys)


def test_shared_memory_of_a_device_by_compute_capability(monkeypatch):
    monkeypatch.delenv("LX_SHARED_MEMORY_KB", raising=False)
    device = lambda cc: types.SimpleNamespace(compute_capability=cc)
    assert tuning.shared_memory_limit(device("9.0")) == H100
    assert tuning.shared_memory_limit(device("8.0")) == A100
    assert tuning.shared_memory_limit(device("8.9")) == CONSUMER
    assert tuning.shared_memory_limit(device("99.9")) == CONSUMER  # unknown: the smallest
    assert tuning.shared_memory_limit(jax.devices("cpu")[0]) == CONSUMER
    monkeypatch.setenv("LX_SHARED_MEMORY_KB", "48")
    assert tuning.shared_memory_limit(device("9.0")) == 48 * KB


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_candidates_fit_the_shared_memory_for_the_head_dimension(head_dim):
    for dtype, itemsize in (("bfloat16", 2), ("float32", 4)):
        for limit in (CONSUMER, A100, H100):
            found = tuning.candidates(head_dim, dtype, limit)
            assert found and all(_need(c.block, head_dim, itemsize, c.num_stages, c.keys) <= limit for c in found)
            assert all(c.interpret is False and (c.num_warps == 4 or c.block >= 64) for c in found)
            for block in (32, 64, 128):  # what is left out does not fit (stage 1 only where 2 does not)
                for stages in (2, 3):
                    fits = _need(block, head_dim, itemsize, stages) <= limit
                    assert fits == any(c.block == c.keys == block and c.num_stages == stages for c in found)
    assert Launch(128, 8, 3, False) in tuning.candidates(64, "bfloat16", H100)
    assert Launch(128, 8, 3, False) not in tuning.candidates(64, "bfloat16", A100)
    # where the backward kernels fit 1 stage only, the forward keeps 2 if they fit it (issue 33: 128-row
    # tiles at head size 128 on an H100 were un-pipelined)
    assert tuning.candidates(256, "bfloat16", CONSUMER) == [Launch(32, 4, 1, False, forward_stages=2)]
    wide = [c for c in tuning.candidates(128, "bfloat16", H100) if c.block == c.keys == 128]
    assert wide == [Launch(128, w, 1, False, forward_stages=2) for w in (4, 8)]
    assert wide[0].label == "block 128, 4 warps, 1 stages (2 in the forward)"
    assert wide[0].compiler_params(forward=True).num_stages == 2 and wide[0].compiler_params().num_stages == 1
    assert all(c.forward_stages is None for c in tuning.candidates(64, "bfloat16", H100))
    assert tuning.candidates(256, "float32", CONSUMER) == [Launch(16, 4, 2, False)]  # no tile of 32 fits


def test_shapes_the_kernel_cannot_take_are_refused_with_the_reason():
    assert tuning.refusal(128, "bfloat16", A100) is None
    for head_dim in (8, 48, 96, 512):
        assert f"not {head_dim}" in tuning.refusal(head_dim, "bfloat16", H100)
    assert "needs about 66 KB of shared memory for heads of 256 in float32; this device has 48 KB" in (
        tuning.refusal(256, "float32", 48 * KB))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_largest_and_smallest_candidates_lower_to_triton(head_dim):
    """Pallas' Triton lowering runs without a GPU: the search's extreme configurations for an H100
    are expressible, and their tile (the grid), warps and stages reach the kernels."""
    h, t = 2, 200
    dims = posenc.ModelDims(d_model=h * head_dim, num_heads=h, head_dim=head_dim, num_layers=1, train_length=512)
    graphdef, state = nnx.split(posenc.build(posenc.default_config("t5"), dims, rngs=nnx.Rngs(0)))
    pos = jnp.arange(t, dtype=jnp.int32)[None]
    found = tuning.candidates(head_dim, "bfloat16", H100)
    for launch in (found[0], found[-1]):
        def loss(state, q, k, v):
            out = pallas_attention(q, k, v, pos, pos, nnx.merge(graphdef, state), launch=launch)
            return out.astype(jnp.float32).sum()
        x = jax.ShapeDtypeStruct((1, t, h, head_dim), jnp.bfloat16)
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(state, x, x, x).lower(
            lowering_platforms=("cuda",)).as_text()
        padded = -(-t // max(launch.block, launch.keys)) * max(launch.block, launch.keys)
        assert text.count("xla.gpu.triton") == 3
        assert text.count(f"num_warps = {launch.num_warps} : i32") == 3
        forward = launch.forward_stages or launch.num_stages  # the query blocks: the grid's first axis
        assert text.count(f"num_stages = {launch.num_stages} : i32") == 3 - (forward != launch.num_stages)
        assert text.count(f"num_stages = {forward} : i32") >= 1
        if launch.keys == launch.block:
            assert text.count(f"grid_x = {padded // launch.block} : i32") == 3
        else:  # forward and dQ over query blocks, dK / dV over key blocks
            assert text.count(f"grid_x = {padded // launch.block} : i32") == 2
            assert text.count(f"grid_x = {padded // launch.keys} : i32") == 1
    assert any(c.keys == 64 and c.block == 128 for c in found)  # flash attention 2's 128 x 64


def test_the_search_takes_the_fastest_configuration_that_passes_once(monkeypatch, tmp_path):
    """In the interpreter: three candidates, the fastest made wrong (its bias one key position off),
    one that 'does not compile'; the second fastest is chosen, and the search runs once."""
    fast, second, broken = Launch(8, 4, 2, True), Launch(8, 8, 2, True), Launch(16, 8, 3, True)
    monkeypatch.setattr(verify, "cache_folder", lambda: tmp_path)
    monkeypatch.setattr(verify, "_VERDICTS", {})
    monkeypatch.setattr(tuning, "_TUNED", {})
    monkeypatch.setattr(tuning, "candidates", lambda *args: [broken, second, fast])
    real = pallas._Config.bias
    monkeypatch.setattr(pallas._Config, "bias", lambda self, leaves, refs, q_pos, k_pos:
                        real(self, leaves, refs, q_pos, k_pos - (self.launch.num_warps == 4)))
    timed = []

    def timer(scheme, dtype, launch):
        timed.append(launch)
        if launch == broken:
            raise RuntimeError("out of resources: shared memory")
        return {fast: 1e-3, second: 2e-3}[launch]
    monkeypatch.setattr(tuning, "measure", timer)
    dims = posenc.ModelDims(d_model=32, num_heads=2, head_dim=16, num_layers=1, train_length=16)
    scheme = posenc.build(posenc.default_config("t5"), dims, rngs=nnx.Rngs(0))

    result = tuning.tuned(scheme, jnp.float32)
    assert result.launch == second and result.verdict.ok
    assert "failed its numerical check" in result.rejected[fast.label]
    assert result.timings[second.label] == 2.0 and "out of resources" in result.timings[broken.label]
    assert len(timed) == 3
    assert tuning.tuned(scheme, jnp.float32) is result and len(timed) == 3  # once per process
    monkeypatch.setattr(tuning, "_TUNED", {})  # and once per machine: the disk answers
    assert tuning.tuned(scheme, jnp.float32).launch == second and len(timed) == 3
