"""What the run knows about its device: whether a step fits, out-of-memory advice, model FLOPs and
peaks, memory in the metrics, and the compilation cache shared by processes."""
import json

import jax
import pytest

from configs import wikitext103
from experiment.config import ConfigError
from experiment.runtime import accelerator, sharding
from experiment.train import loop, train
from models.config import ModelConfig
from tests.conftest import run_entry, tiny_config


def test_a_step_that_cannot_fit_names_the_options():
    step = dict(micro_rows=18, micro_steps=8, seq_len=512, fsdp=1, devices=8)
    assert accelerator.memory_advice(10 * 2**30, 80 * 2**30, **step) is None
    assert accelerator.memory_advice(None, 80 * 2**30, **step) is None  # sizes unknown (CPU)
    advice = accelerator.memory_advice(90 * 2**30, 80 * 2**30, **step)
    assert "90.0 GiB" in advice and "--config.train.device_batch_tokens=4608" in advice
    assert "--config.mesh.fsdp=2" in advice
    assert "mesh.fsdp" not in accelerator.memory_advice(90 * 2**30, 80 * 2**30, **{**step, "devices": 1})


def test_training_refuses_a_step_larger_than_the_device(tmp_path, monkeypatch):
    monkeypatch.setattr(accelerator, "device_memory_limit", lambda device=None: 1024)
    with pytest.raises(ConfigError, match="device_batch_tokens"):
        train(tiny_config("alibi"), tmp_path)


def test_out_of_memory_from_xla_becomes_advice_and_other_errors_pass(tmp_path, monkeypatch):
    def exhausted(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 62.91GiB")
    monkeypatch.setattr(sharding, "global_batch", exhausted)  # as a failing first step would
    with pytest.raises(ConfigError, match="out of memory.*device_batch_tokens"):
        train(tiny_config("alibi"), tmp_path / "oom")
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        with loop._out_of_memory_explained(dict(micro_rows=1, micro_steps=1, seq_len=16, fsdp=1, devices=1)):
            raise jax.errors.JaxRuntimeError("INTERNAL: something else")


def test_model_flops_and_peaks():
    config = wikitext103.get_config("alibi,512")
    cfg = ModelConfig.from_config(config.model, 267_735)
    flops = accelerator.training_flops_per_token(cfg, 512, 267_735)
    # 6 x (16 layers x 12.6M weights in products + the head's 1024 x 20002) plus attention
    assert 6 * (16 * 12_582_912 + 1024 * 20_002) < flops < 1.1 * 6 * (16 * 12_582_912 + 1024 * 20_002)

    class Device:
        device_kind = "NVIDIA H100 80GB HBM3"
    assert accelerator.peak_tflops(Device()) == pytest.approx(989.4)
    Device.device_kind = "cpu"
    assert accelerator.peak_tflops(Device()) is None


def test_metrics_report_memory_beside_tokens_per_second(tmp_path, monkeypatch):
    monkeypatch.setenv("LX_PEAK_TFLOPS", "1.0")  # a CPU has no table entry: a stated peak gives MFU
    train(tiny_config("alibi"), tmp_path)
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["peak_host_memory_gb"] > 0.05 and 0 < record["mfu"] < 1 and record["tokens_per_s"] > 0


def test_a_second_evaluation_process_compiles_nothing_new(tmp_path):
    import time
    config = tiny_config("alibi")
    train(config, tmp_path / "run")
    cache = tmp_path / "xla_cache"
    env = {"LX_COMPILATION_CACHE": str(cache), "JAX_PLATFORMS": "cpu"}
    args = ("eval_extrapolate.py", "--workdir", str(tmp_path / "run"), "--lengths", "16,32,48",
            "--max_tokens", "3000")
    entries, seconds = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        result = run_entry(*args, env=env)
        seconds.append(time.perf_counter() - t0)
        assert result.returncode == 0, result.stderr[-3000:]
        entries.append(sorted(p.name for p in cache.iterdir()))
    assert len(entries[0]) >= 3  # one scoring program per length, at least
    assert entries[1] == entries[0], "the second process compiled programs the first had cached"
    print(f"first call {seconds[0]:.1f} s, second {seconds[1]:.1f} s")
