"""Scaling out: gradient accumulation, the data x FSDP mesh, the paper config on 1 and 8 devices,
the memory check and the efficiency figures. Several devices are simulated on the CPU
(XLA_FLAGS=--xla_force_host_platform_device_count=8) in a subprocess."""
import json
import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import corpora
from configs import wikitext103
from experiment import accelerator, checkpoints, config_util, sharding, train, training
from tests.conftest import REPO, SHARED_WIKITEXT, run_entry, tiny_config

EIGHT_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


def test_micro_steps_are_the_fewest_that_fit_each_devices_share():
    assert training.micro_batching(144, 512, 9216, 1) == 8   # the paper's update on one device
    assert training.micro_batching(144, 512, 9216, 2) == 4
    assert training.micro_batching(144, 512, 9216, 8) == 1   # the paper's 8 GPUs
    assert training.micro_batching(144, 512, 9216, 3) == 3   # 48 rows per device: 3 x 16
    assert training.micro_batching(144, 512, 0, 1) == 1      # no cap
    assert training.micro_batching(10, 16, 48, 1) == 5       # 3 rows fit; 10 rows -> 5 x 2
    with pytest.raises(training.ConfigError, match="device_batch_tokens"):
        training.micro_batching(8, 512, 100, 1)
    with pytest.raises(training.ConfigError, match="multiple of 8"):
        training.micro_batching(12, 16, 0, 8)


def one_update(config, micro_steps: int):
    """Parameters after one update of `config` on one device, and the step's metrics."""
    config = config_util.resolve(config)
    tc = config.train
    mesh = sharding.make_mesh(1, jax.devices()[:1])
    tx = training.make_optimizer(tc)
    graphdef, params, opt_state, shards, scheme = training.init_state(config, 256, tx, mesh)
    step = training.make_train_step(graphdef, tx, 7, micro_steps=micro_steps,
                                    per_example_keys=training.is_stochastic(config.model, scheme),
                                    grad_shardings=shards, rng_impl=tc.get("dropout_rng", "threefry"))
    stream = np.random.default_rng(0).integers(0, 256, 5000)
    inputs, targets = corpora.train_batch(stream, 0, tc.batch_size, tc.seq_len, 0)
    params, _, metrics = step(params, opt_state, inputs, targets, np.int32(0))
    return params, jax.device_get(metrics)


def test_dropout_rng_option_is_reproducible_and_defaults_to_threefry():
    """train.dropout_rng picks the dropout keys' PRNG; a config without it (runs saved before the
    option) draws the masks it always did."""
    config = tiny_config("alibi")
    config.model.update(dict(dropout=0.3))
    config.train.update(dict(batch_size=2, optimizer="nag", momentum=0.9, lr=0.5, warmup_steps=0))
    legacy, _ = one_update(config, 1)
    config.train.dropout_rng = "threefry"
    threefry, _ = one_update(config, 1)
    config.train.dropout_rng = "rbg"
    rbg, _ = one_update(config, 1)
    rbg_again, _ = one_update(config, 1)
    leaves = lambda p: [np.asarray(x) for x in jax.tree.leaves(p)]
    for a, b, c, d in zip(leaves(legacy), leaves(threefry), leaves(rbg), leaves(rbg_again)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, d)
    assert any(not np.array_equal(a, c) for a, c in zip(leaves(threefry), leaves(rbg)))
    with pytest.raises(training.ConfigError, match="dropout_rng"):
        training.make_train_step(None, None, 0, rng_impl="philox")


@pytest.mark.parametrize("dropout,k", [pytest.param(0.0, 2, marks=pytest.mark.slow), (0.3, 8)])  # 8: one sequence per micro-step
def test_accumulated_update_equals_the_one_shot_update(dropout, k):
    config = tiny_config("alibi")
    config.model.update(dict(dropout=dropout, attention_dropout=dropout / 3, activation_dropout=dropout / 3))
    # NAG, the paper's optimizer: Adam's first step is g / |g| per weight, which turns the rounding noise
    # of gradients that are exactly zero in exact arithmetic (the key bias) into full-size steps.
    config.train.update(dict(batch_size=8, optimizer="nag", momentum=0.99, lr=0.5, warmup_steps=0,
                             grad_clip=0.05))  # clipping active
    whole, m1 = one_update(config, 1)
    split, mk = one_update(config, k)
    np.testing.assert_allclose(mk["loss"], m1["loss"], rtol=1e-5)
    np.testing.assert_allclose(mk["grad_norm"], m1["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(split), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    if dropout:  # the masks really are drawn: without dropout the loss differs
        config.model.update(dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0))
        assert abs(one_update(config, 1)[1]["loss"] - m1["loss"]) > 1e-3


@pytest.mark.slow  # the dropout case of test_accumulated_update_equals_the_one_shot_update covers per-row keys
def test_randomized_positions_are_drawn_per_row():
    config = tiny_config("randomized")
    config.train.update(dict(batch_size=4, warmup_steps=0, optimizer="nag", momentum=0.9, lr=0.1))
    (whole, m1), (split, m2) = one_update(config, 1), one_update(config, 4)
    np.testing.assert_allclose(m2["loss"], m1["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(split), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


MESH_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
import jax
from tests.conftest import tiny_config
from tests.test_scaling import paper_config_shrunk
from experiment import config_util, sharding, train, training
out = {{"devices": jax.device_count()}}
for fsdp in (1, 2, 4):
    config = tiny_config("rope")
    config.train.update(dict(steps=3, checkpoint_every=3, batch_size=16, device_batch_tokens=16))  # 2 x 1 row
    config.mesh = dict(fsdp=fsdp)
    summary = train(config, sys.argv[1] + f"/fsdp{{fsdp}}")
    mesh = sharding.make_mesh(fsdp)
    tx = training.make_optimizer(config.train)
    _, params, opt_state, _, _ = training.init_state(config_util.resolve(config), 256, tx, mesh)
    kernel = params["blocks"][0]["fc1"]["kernel"]
    momenta = [x for x in jax.tree.leaves(opt_state) if x.shape == kernel.shape]
    out[fsdp] = {{"micro_steps": summary["micro_steps"], "spec": str(kernel.sharding.spec),
                  "shard": list(kernel.addressable_shards[0].data.shape),
                  "opt_specs": sorted({{str(x.sharding.spec) for x in momenta}})}}
if len(sys.argv) > 2:  # the paper config too
    paper = paper_config_shrunk()
    paper.mesh.fsdp = 2  # adaptive input / softmax tables sharded too
    summary = train(paper, sys.argv[1] + "/paper")
    out["paper"] = summary["micro_steps"]
print(json.dumps(out))
"""


def paper_config_shrunk():
    """configs/wikitext103.py as it is (the paper's 144 x 512 update, 9,216 tokens per device,
    dropout, NAG, adaptive input / softmax), with a small model, trained one step on WikiText-103's
    validation split."""
    config = wikitext103.get_config("alibi,512")
    config.data.update(dict(source="local", path=str(SHARED_WIKITEXT / "wikitext-103"), train_split="valid"))
    config.model.update(dict(num_layers=2, d_model=32, num_heads=4, mlp_dim=64, adaptive_cutoffs=(2000, 10000)))
    config.train.update(dict(steps=1, checkpoint_every=1, warmup_steps=1))
    return config


def losses(workdir):
    return [json.loads(l)["loss"] for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def restored_params(workdir, config, vocab_size=256):
    config = config_util.resolve(config)
    model = training.build_model(config, vocab_size)
    template = training.nnx.split(model)[1]
    params, _, _ = checkpoints.restore(checkpoints.manager(pathlib.Path(workdir)), template)
    return params


def test_meshes_on_eight_devices_match_one_device(tmp_path):
    result = run_entry("-c", MESH_SCRIPT.format(repo=str(REPO)), str(tmp_path / "d8"), env=EIGHT_DEVICES,
                       timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8

    # one device, in this process: the same three steps
    reference = tiny_config("rope")
    reference.train.update(dict(steps=3, checkpoint_every=3, batch_size=16))
    train(reference, tmp_path / "d1")
    ref_params = restored_params(tmp_path / "d1", reference)
    for fsdp, shard_rows in ((1, 32), (2, 16), (4, 8)):
        got = out[str(fsdp)]
        assert got["micro_steps"] == 2
        np.testing.assert_allclose(losses(tmp_path / "d8" / f"fsdp{fsdp}"), losses(tmp_path / "d1"), rtol=1e-5)
        params = restored_params(tmp_path / "d8" / f"fsdp{fsdp}", reference)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        # fc1's kernel (d_model=32 x 64): its input dimension split over the FSDP axis, and the
        # optimizer's moments with it
        assert got["spec"] == str(P(None, None) if fsdp == 1 else P("fsdp", None))
        assert got["shard"] == [shard_rows, 64]
        assert got["opt_specs"] == [got["spec"]]



@pytest.mark.slow  # about a minute: WikiText-103 valid at word level, twice
def test_paper_config_on_eight_devices_matches_one_device(tmp_path, wikitext103):
    result = run_entry("-c", MESH_SCRIPT.format(repo=str(REPO)), str(tmp_path / "d8"), "paper", env=EIGHT_DEVICES,
                       timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    # the paper config: 8 micro-steps of 18 sequences here, one step of 18 per device there (mesh 4 x 2)
    summary = train(paper_config_shrunk(), tmp_path / "paper1")
    assert summary["micro_steps"] == 8 and out["paper"] == 1
    np.testing.assert_allclose(losses(tmp_path / "d8" / "paper"), losses(tmp_path / "paper1"), rtol=1e-5)
    grad_norms = [[json.loads(l)["grad_norm"] for l in (p / "metrics.jsonl").read_text().splitlines()]
                  for p in (tmp_path / "d8" / "paper", tmp_path / "paper1")]
    np.testing.assert_allclose(grad_norms[0], grad_norms[1], rtol=1e-4)


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
    with pytest.raises(training.ConfigError, match="device_batch_tokens"):
        train(tiny_config("alibi"), tmp_path)


def test_out_of_memory_from_xla_becomes_advice_and_other_errors_pass(tmp_path, monkeypatch):
    def exhausted(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 62.91GiB")
    monkeypatch.setattr(training.sharding, "global_batch", exhausted)  # as a failing first step would
    with pytest.raises(training.ConfigError, match="out of memory.*device_batch_tokens"):
        train(tiny_config("alibi"), tmp_path / "oom")
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        with training._out_of_memory_explained(dict(micro_rows=1, micro_steps=1, seq_len=16, fsdp=1, devices=1)):
            raise jax.errors.JaxRuntimeError("INTERNAL: something else")


def test_model_flops_and_peaks():
    config = wikitext103.get_config("alibi,512")
    cfg = training.ModelConfig.from_config(config.model, 267_735)
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


WORKER_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
process_id, port, workdir, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
from experiment import distributed
distributed.initialize(f"127.0.0.1:{{port}}", 2, process_id)
import jax
from tests.conftest import tiny_config
from experiment import evaluate, train
config = tiny_config("rope")
config.train.update(dict(steps=steps, checkpoint_every=3, batch_size=8))
summary = train(config, workdir)
(record,) = evaluate(workdir, [32], max_tokens=2048)
print(json.dumps({{"processes": jax.process_count(), "devices": jax.device_count(), "step": summary["step"],
                  "nll": record["nll"]}}))
"""


def run_two_processes(tmp_path, workdir, steps):
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**__import__("os").environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu", "LX_COMPILATION_CACHE": "off"}
    script = WORKER_SCRIPT.format(repo=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i), port, str(workdir), str(steps)],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


def test_two_processes_train_resume_and_evaluate_as_one(tmp_path):  # about 30 s on 2 cores
    from experiment import evaluate
    first = run_two_processes(tmp_path, tmp_path / "two", 3)
    assert [o["processes"] for o in first] == [2, 2] and first[0]["devices"] == 4
    reference = tiny_config("rope")
    reference.train.update(dict(steps=3, checkpoint_every=3, batch_size=8))
    train(reference, tmp_path / "one")
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(restored_params(tmp_path / "two", reference)),
                    jax.tree.leaves(restored_params(tmp_path / "one", reference))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    (record,) = evaluate(tmp_path / "one", [32], max_tokens=2048)
    assert first[0]["nll"] == first[1]["nll"] == pytest.approx(record["nll"], rel=1e-5)

    # resume from that checkpoint, two processes again: the log has each step once, as one process's
    second = run_two_processes(tmp_path, tmp_path / "two", 6)
    assert [o["step"] for o in second] == [6, 6]
    reference.train.steps = 6
    train(reference, tmp_path / "one")
    steps = [json.loads(l)["step"] for l in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5)
    records = json.loads((tmp_path / "two" / "eval" / "extrapolation.json").read_text())
    assert len(records) == 1 and records[0]["step"] == 6


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
