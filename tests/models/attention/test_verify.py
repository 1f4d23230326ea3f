"""The fused kernel's check on the device (models/attention/verify.py) and what `choose` does with
its verdict, in Pallas' interpreter on CPU standing in for a GPU: a kernel made wrong on purpose (its
bias read one key position off) fails the check, `auto` keeps XLA's paths and says why in one line,
an explicit model.attention=pallas refuses it unless model.attention_check is off; a correct kernel
passes and `auto` takes it; verdicts are cached in memory and on disk, once per key."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc
from models.attention import choice, launches, pallas, paths, tuning, verdicts, verify
from models.attention.pallas import Launch
from models.config import ModelConfig

LAUNCH = Launch(block=8, interpret=True)  # 53-token check inputs: diagonal, off-diagonal and padded tiles
AUTO = ModelConfig(attention="auto")
POS = jnp.arange(16, dtype=jnp.int32)[None]


def _scheme(name: str = "t5", head_dim: int = 16):
    dims = posenc.ModelDims(d_model=2 * head_dim, num_heads=2, head_dim=head_dim, num_layers=1, train_length=16)
    return posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """As on a GPU (the kernel 'compiled'), with one launch configuration to search, run in the
    interpreter; caches empty, the disk cache in tmp_path. Returns the disk cache's folder."""
    pallas._flash_call.clear_cache()
    monkeypatch.setattr(pallas, "interpreted", lambda: False)
    monkeypatch.setattr(launches, "forward_candidates", lambda *args: [LAUNCH])  # one of each: nothing timed
    monkeypatch.setattr(launches, "backward_candidates", lambda *args: [LAUNCH])
    monkeypatch.setattr(tuning, "call_seconds", lambda path, *args, **kwargs: 1e-3 if path == "pallas" else 2e-3)
    monkeypatch.setattr(tuning, "_RACES", {})
    monkeypatch.setattr(verdicts, "cache_folder", lambda: tmp_path / "kernel_checks")
    monkeypatch.setattr(verdicts, "_VERDICTS", {})
    monkeypatch.setattr(tuning, "_TUNED", {})
    monkeypatch.setattr(choice, "_SAID", set())
    return tmp_path / "kernel_checks"


def _choose_inside_a_trace(cfg, scheme, dtype=jnp.float32, dropping=False) -> str:
    """`choose` as the decoder calls it, inside a model's trace (the scheme's parameters are tracers)."""
    graphdef, state = nnx.split(scheme)
    kinds = []
    jax.jit(lambda state: kinds.append(choice.choose(cfg, nnx.merge(graphdef, state), POS, dtype,
                                                     dropping=dropping)) or 0.0).trace(state)
    return kinds[0]


def test_a_kernel_with_its_bias_one_position_off_fails_and_auto_keeps_xla(gpu, monkeypatch, capsys):
    real = pallas._Config.bias
    monkeypatch.setattr(pallas._Config, "bias", lambda self, leaves, refs, q_pos, k_pos:
                        real(self, leaves, refs, q_pos, k_pos - 1))
    scheme = _scheme("t5")
    assert _choose_inside_a_trace(AUTO, scheme) == "triangular"  # what auto takes without the kernel
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("model.attention=auto: the Pallas kernel for 't5'")
    assert "failed its numerical check" in out and "using XLA's attention paths" in out
    verdict = tuning.kernel_verdict(scheme, jnp.float32)
    assert verdict.status == "mismatch" and verdict.errors["dq"] > 10 * verdict.tolerances["dq"]
    assert verdict.errors["dq"] > 1e3 * verdict.xla_errors["dq"]  # XLA's own float32 error is ~1e-7

    explicit = dataclasses.replace(AUTO, attention="pallas")
    with pytest.raises(ValueError, match="model.attention=pallas: the Pallas kernel .* failed its numerical check"):
        choice.choose(explicit, scheme, POS, jnp.float32, dropping=False)
    unchecked = dataclasses.replace(explicit, attention_check=False)  # benchmarking only
    assert choice.choose(unchecked, scheme, POS, jnp.float32, dropping=False) == "pallas"
    assert capsys.readouterr().out == ""  # said once


def test_a_correct_kernel_passes_and_its_verdict_is_kept_on_disk(gpu, monkeypatch):
    scheme = _scheme("kerple_log")
    assert _choose_inside_a_trace(AUTO, scheme) == "pallas"
    dropping = dataclasses.replace(AUTO, attention_dropout=0.1)
    assert _choose_inside_a_trace(dropping, scheme, dropping=True) == "pallas"  # its dropout checked too
    files = {"-".join(p.name.split("-")[:2]): p for p in gpu.iterdir()}
    assert sorted(files) == ["check-pallas", "check-pallas+dropout", "race-pallas", "search-pallas"]
    raced = json.loads(sorted(gpu.glob("race-pallas-*-triangular-eval-r1-L16.json"))[0].read_text())
    assert raced == {"kernel_ms": 1.0, "rival_ms": 2.0, "rival": "triangular", "launch": LAUNCH.label,
                     "workload": {"rows": 1, "length": 16, "training": False, "dropout": 0.0, "per_row": False}}
    dropped = json.loads(files["check-pallas+dropout"].read_text())
    assert dropped["status"] == "passed" and dropped["errors"]["dv"] < 1e-5
    saved = json.loads(files["check-pallas"].read_text())
    assert saved["status"] == "passed" and set(saved["errors"]) >= {"out", "dq", "dk", "dv"}
    assert any("r1" in name for name in saved["errors"])  # the bias's learned parameters are compared too
    assert all(saved["errors"][n] <= saved["tolerances"][n] for n in saved["errors"])
    assert "cpu-kerple_log-h2-d16-float32-b8w4s2-interpreted" in files["check-pallas"].name

    def must_not_run(*args):
        raise AssertionError("the cache should have answered")
    monkeypatch.setattr(verdicts, "_VERDICTS", {})  # a new process: the disk answers, nothing runs
    monkeypatch.setattr(tuning, "_TUNED", {})
    monkeypatch.setattr(verify, "check", must_not_run)
    monkeypatch.setattr(tuning, "search", must_not_run)
    eval_16 = tuning.Workload(1, 16, training=False)
    assert tuning.kernel_verdict(scheme, jnp.float32, eval_16).ok
    assert tuning.device_launch(scheme, jnp.float32, eval_16) == LAUNCH

    key = verdicts.cache_key("check", scheme, jnp.float32, LAUNCH)
    for other in (verdicts.cache_key("check", scheme, jnp.bfloat16, LAUNCH),
                  verdicts.cache_key("check", scheme, jnp.float32, dataclasses.replace(LAUNCH, num_warps=8)),
                  verdicts.cache_key("check", scheme, jnp.float32, LAUNCH.with_backward(Launch(16, interpret=True))),
                  verdicts.cache_key("check", _scheme("kerple_log", head_dim=32), jnp.float32, LAUNCH)):
        assert other != key
    assert {"jaxlib", "platform"} <= set(verdicts.runtime_versions())  # issue 68, item 7
    for changed in ("jaxlib", "platform", "cudnn", "cuda_driver"):  # another jaxlib, CUDA, cuDNN or driver
        real = verdicts.runtime_versions()
        monkeypatch.setattr(verdicts, "runtime_versions", lambda: {**real, changed: "another"})
        assert verdicts.cache_key("check", scheme, jnp.float32, LAUNCH) != key
        monkeypatch.setattr(verdicts, "runtime_versions", lambda: real)
        assert verdicts.cache_key("check", scheme, jnp.float32, LAUNCH) == key


def test_head_dimensions_the_compiled_kernel_cannot_take_are_refused_without_running(gpu, monkeypatch, capsys):
    monkeypatch.setattr(verify, "check", lambda *args: pytest.fail("a refused shape must not run"))
    scheme = _scheme("alibi", head_dim=24)
    verdict = tuning.kernel_verdict(scheme, jnp.bfloat16)
    assert verdict.status == "refused" and "powers of 2 from 16 to 256, not 24" in verdict.reason
    assert choice.choose(AUTO, scheme, POS, jnp.bfloat16, dropping=False) == "triangular"  # its row refuses
    with pytest.raises(ValueError, match="model.attention=pallas: the Pallas kernel takes .* not 24"):
        choice.choose(dataclasses.replace(AUTO, attention="pallas"), scheme, POS, jnp.bfloat16, dropping=False)
    spec = paths.CallSpec.of(scheme, 16, jnp.bfloat16)
    assert "not 24" in paths.PATHS["pallas"].accepts(scheme.traits, spec)  # the refusal is the row's, up front
    monkeypatch.setattr(pallas, "interpreted", lambda: True)
    assert paths.PATHS["pallas"].accepts(scheme.traits, spec) is None  # the interpreter takes any head size


def test_auto_keeps_xlas_path_where_the_kernel_is_slower_there_and_says_so_once(gpu, monkeypatch, capsys):
    """A kernel that passes its check but loses the race against the path auto would take otherwise
    at the call's shape (FIRE's in-kernel MLP, say) is not taken; one line says both times."""
    monkeypatch.setattr(tuning, "call_seconds", lambda path, *args, **kwargs: 3e-3 if path == "pallas" else 2e-3)
    scheme = _scheme("kerple_log")
    assert _choose_inside_a_trace(AUTO, scheme) == "triangular"
    assert _choose_inside_a_trace(AUTO, scheme) == "triangular"
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "takes 3 ms against triangular's 2 ms (forward, 1 x 16 tokens)" in out
    assert out.endswith("using triangular\n")
    assert choice.choose(dataclasses.replace(AUTO, attention="pallas"), scheme, POS, jnp.float32,
                         dropping=False) == "pallas"  # asked for explicitly: the kernel, however fast


def test_the_race_times_repeats_inside_one_compiled_loop():
    calls = []

    def step(x):
        calls.append(1)  # traced once, whatever the repeats
        return {"y": jnp.tanh(x) * 2.0}
    seconds = tuning.loop_seconds(step, (jnp.ones((64, 64)),), min_seconds=0.01)
    assert 0 < seconds < 0.01 and len(calls) == 1
    work = tuning.Workload(32, 16384, dropout=0.1, per_row=True)
    assert tuning.Workload(32, 512).raced() == tuning.Workload(32, 512)
    assert work.raced() == tuning.Workload(4, 16384, dropout=0.1, per_row=True)
    assert tuning.Workload(1, 131072).raced().rows == 1
    assert tuning.Workload(18, 1000, training=False).searched() == tuning.Workload(18, 1024, training=False)
    assert tuning.Workload(18, 600).searched() == tuning.Workload(18, 1024)  # an octave: one search


def test_a_race_runs_from_inside_a_models_trace():
    """`choose` races the kernel at trace time: the race's inputs are concrete there (interpreter,
    tiny shape; the time itself means nothing here)."""
    scheme = _scheme("alibi")
    graphdef, state = nnx.split(scheme)
    seconds = []
    jax.jit(lambda state: seconds.append(tuning.call_seconds("triangular", nnx.merge(graphdef, state), jnp.float32,
                                                             tuning.Workload(1, 16))) or 0.0).trace(state)
    assert seconds[0] > 0
