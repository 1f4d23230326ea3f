"""The Pallas kernel's launch configurations per device and workload (models/attention/launches.py,
tuning.py): the forward's and the backward's candidates fit the device's shared memory for the head
dimension, best guess first; shapes the kernel cannot take are refused with the reason; a forward and
a backward of their own tiles lower to Triton with their warps and stages; the search times the
forward alone, then the backward with the fastest forward, at the workload's shape, and takes the
fastest configuration that passes the check, once; the race times the calls as the workload runs."""
import types

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc
from models.attention import launches, pallas, tuning, verdicts
from models.attention.launches import lowering_for_a_gpu
from models.attention.pallas import Launch, pallas_attention

KB = 1024
A100, H100, CONSUMER = 163 * KB, 227 * KB, 99 * KB


def _scheme(name="t5", head_dim=16, heads=2, train_length=16):
    dims = posenc.ModelDims(d_model=heads * head_dim, num_heads=heads, head_dim=head_dim, num_layers=1,
                            train_length=train_length)
    return posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))


def test_shared_memory_of_a_device_by_compute_capability(monkeypatch):
    monkeypatch.delenv("LX_SHARED_MEMORY_KB", raising=False)
    device = lambda cc: types.SimpleNamespace(compute_capability=cc)
    assert launches.shared_memory_limit(device("9.0")) == H100
    assert launches.shared_memory_limit(device("8.0")) == A100
    assert launches.shared_memory_limit(device("8.9")) == CONSUMER
    assert launches.shared_memory_limit(device("99.9")) == CONSUMER  # unknown: the smallest
    assert launches.shared_memory_limit(jax.devices("cpu")[0]) == CONSUMER
    monkeypatch.setenv("LX_SHARED_MEMORY_KB", "48")
    assert launches.shared_memory_limit(device("9.0")) == 48 * KB


def _forward_need(block, keys, head_dim, itemsize, stages):  # Q, `stages` K and V tiles, P
    return itemsize * (block * head_dim + 2 * stages * keys * head_dim + block * keys)


def _backward_need(block, keys, head_dim, itemsize, stages):  # K, V, `stages` Q and dO tiles, P and dS
    return itemsize * (2 * keys * head_dim + 2 * stages * block * head_dim + 2 * block * keys)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_candidates_fit_the_shared_memory_for_the_head_dimension(head_dim, monkeypatch):
    monkeypatch.delenv("LX_LAUNCH_CANDIDATES", raising=False)
    for dtype, itemsize in (("bfloat16", 2), ("float32", 4)):
        for limit in (CONSUMER, A100, H100):
            for found, need, tiles in ((launches.forward_candidates(head_dim, dtype, limit), _forward_need,
                                        launches.FORWARD_TILES),
                                       (launches.backward_candidates(head_dim, dtype, limit), _backward_need,
                                        launches.BACKWARD_TILES)):
                assert found and all(need(c.block, c.keys, head_dim, itemsize, c.num_stages) <= limit for c in found)
                assert all(c.interpret is False and c.backward is None for c in found)
                for block, keys in tiles:  # what is left out does not fit (stage 1 only where 2 does not)
                    for stages in (2, 3):
                        fits = need(block, keys, head_dim, itemsize, stages) <= limit
                        assert fits == any((c.block, c.keys, c.num_stages) == (block, keys, stages) for c in found)
    # best guess first: flash attention 2's 128 x 64 forward, 64 x 64 backward, 8 warps, 2 stages
    first = launches.default(128, "bfloat16", H100)
    assert first == Launch(128, 8, 2, False, 64, backward=Launch(64, 8, 2, False, 64))
    assert first.label == ("forward blocks 128 x 64, 8 warps, 2 stages; backward block 64, 8 warps, 2 stages")
    smallest = [Launch(16, 4, 2, False, 16), Launch(16, 8, 2, False, 16)]  # no tile of the lists fits
    assert launches.forward_candidates(256, "float32", CONSUMER) == smallest
    assert launches.backward_candidates(256, "float32", CONSUMER) == smallest
    monkeypatch.setenv("LX_LAUNCH_CANDIDATES", "2")
    assert len(launches.forward_candidates(128, "bfloat16", H100)) == len(
        launches.backward_candidates(128, "bfloat16", H100)) == 2


def test_shapes_the_kernel_cannot_take_are_refused_with_the_reason():
    assert launches.refusal(128, "bfloat16", A100) is None
    for head_dim in (8, 48, 96, 512):
        assert f"not {head_dim}" in launches.refusal(head_dim, "bfloat16", H100)
    assert "needs about 66 KB of shared memory for heads of 256 in float32; this device has 48 KB" in (
        launches.refusal(256, "float32", 48 * KB))


def test_a_forward_and_a_backward_of_their_own_tiles_lower_to_triton():
    """Pallas' Triton lowering runs without a GPU: the first forward candidate for an H100 with the
    last backward one; each kernel gets its own grid, warps and stages."""
    h, t, head_dim = 2, 200, 128
    scheme = _scheme("t5", head_dim)
    graphdef, state = nnx.split(scheme)
    pos = jnp.arange(t, dtype=jnp.int32)[None]
    forward = launches.forward_candidates(head_dim, "bfloat16", H100)[0]
    backward = launches.backward_candidates(head_dim, "bfloat16", H100)[-1]
    launch = forward.with_backward(backward)
    assert (forward.block, forward.keys, forward.num_warps) != (backward.block, backward.keys, backward.num_warps)

    def loss(state, q, k, v):
        return pallas_attention(q, k, v, pos, pos, nnx.merge(graphdef, state), launch=launch).astype(jnp.float32).sum()
    x = jax.ShapeDtypeStruct((1, t, h, head_dim), jnp.bfloat16)
    with lowering_for_a_gpu():
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(state, x, x, x).lower(
            lowering_platforms=("cuda",)).as_text()
    padded = -(-t // max(launch.tiles)) * max(launch.tiles)
    assert text.count("xla.gpu.triton") == 3
    warps = [f"num_warps = {x.num_warps} : i32" for x in (forward, backward, backward)]
    assert all(text.count(w) == warps.count(w) for w in set(warps))
    grids = [padded // forward.block, padded // backward.block, padded // backward.keys]  # forward, dQ, dK / dV
    assert all(text.count(f"grid_x = {g} : i32") == grids.count(g) for g in set(grids))


def test_the_search_times_forward_then_backward_at_the_workload_and_takes_the_fastest_that_passes(monkeypatch,
                                                                                                  tmp_path):
    """In the interpreter: two forward candidates, three backward ones, the fastest backward made
    wrong (its kernels read the bias one key position off), one that 'does not compile'. The forward
    is timed alone, the backward with the fastest forward, both at the workload's searched shape;
    the second fastest backward is chosen; once per process and once per machine."""
    f_fast, f_slow = Launch(8, 4, 2, True), Launch(4, 4, 2, True)  # small tiles: short checks in the interpreter
    b_wrong, b_good, b_broken = Launch(8, 8, 2, True), Launch(8, 4, 3, True), Launch(4, 8, 3, True)
    monkeypatch.setattr(verdicts, "cache_folder", lambda: tmp_path)
    monkeypatch.setattr(verdicts, "_VERDICTS", {})
    monkeypatch.setattr(tuning, "_TUNED", {})
    monkeypatch.setattr(pallas, "interpreted", lambda: False)
    monkeypatch.setattr(launches, "forward_candidates", lambda *args: [f_slow, f_fast])
    monkeypatch.setattr(launches, "backward_candidates", lambda *args: [b_broken, b_good, b_wrong])
    real = pallas._Config.bias
    monkeypatch.setattr(pallas._Config, "bias", lambda self, leaves, refs, q_pos, k_pos:
                        real(self, leaves, refs, q_pos, k_pos - (self.launch.num_warps == 8
                                                                 and self.launch.num_stages == 2)))
    timed = []

    def timer(scheme, dtype, work, launch, forward_only):
        timed.append((launch.tiles_label, launch.bwd.tiles_label, forward_only, work))
        if forward_only:
            return {f_fast: 1e-3, f_slow: 2e-3}[launch.with_backward(None)]
        if launch.bwd == b_broken:
            raise RuntimeError("out of resources: shared memory")
        return {b_wrong: 3e-3, b_good: 4e-3}[launch.bwd]
    monkeypatch.setattr(tuning, "_timer", timer)
    work = tuning.Workload(18, 40, dropout=0.1, per_row=True)  # training: searched at 18 x 64
    result = tuning.tuned(_scheme(), jnp.float32, work)
    assert result.launch == f_fast.with_backward(b_good) and result.verdict.ok
    assert "failed its numerical check" in result.rejected[f_fast.with_backward(b_wrong).label]
    assert result.timings["forward " + f_fast.tiles_label] == 1.0
    assert "out of resources" in result.timings["backward " + b_broken.tiles_label]
    assert [t[2] for t in timed] == [True, True, False, False, False]  # the forwards alone, then the backwards
    assert all(t[0] == f_fast.tiles_label for t in timed[2:])  # ... with the fastest forward
    assert {t[3] for t in timed} == {tuning.Workload(18, 64, dropout=0.1, per_row=True)}
    assert tuning.tuned(_scheme(), jnp.float32, work) is result and len(timed) == 5  # once per process
    monkeypatch.setattr(tuning, "_TUNED", {})  # and once per machine: the disk answers
    assert tuning.tuned(_scheme(), jnp.float32, work).launch == result.launch and len(timed) == 5
    monkeypatch.setattr(verdicts, "verified", lambda path, scheme, dtype, launch: result.verdict)  # checked above
    evaluation = tuning.Workload(18, 40, training=False)  # forward only: no backward timed
    timed.clear()
    assert tuning.tuned(_scheme(), jnp.float32, evaluation).launch.with_backward(None) == f_fast
    assert [t[2] for t in timed] == [True, True]


def test_the_race_runs_the_calls_as_training_does(monkeypatch):
    """`call_seconds` in training: the gradient of every input and parameter, each row its own call
    under a vmap with its own dropout key; in evaluation the forward alone."""
    programs = []
    monkeypatch.setattr(tuning, "loop_seconds", lambda step, args: programs.append(
        jax.make_jaxpr(step)(*args)) or 1.0)
    scheme = _scheme("alibi")
    tuning.call_seconds("dense", scheme, jnp.float32, tuning.Workload(3, 16, dropout=0.1, per_row=True))
    tuning.call_seconds("dense", scheme, jnp.float32, tuning.Workload(3, 16, training=False))
    train, evaluation = programs
    assert "random_bits" in str(train) and "random_bits" not in str(evaluation)  # each row's own dropout key
    assert [a.shape for a in train.out_avals] == [(3, 16, 2, 16)] * 3  # dQ, dK, dV (alibi learns nothing)
    assert [a.shape for a in evaluation.out_avals] == [(3, 16, 2, 16)]  # the output alone
