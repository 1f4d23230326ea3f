"""Several processes as one job (jax.distributed on 127.0.0.1, gloo): train, resume and evaluate
as one process does."""
import json

import jax
import numpy as np
import pytest

from experiment.train import train
from tests.conftest import REPO, tiny_config
from tests.helpers import losses, restored_params


WORKER_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
process_id, port, workdir, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
from experiment.runtime import distributed
distributed.initialize(f"127.0.0.1:{{port}}", 2, process_id)
import jax
from tests.conftest import tiny_config
from experiment.evals import evaluate
from experiment.train import train
config = tiny_config("rope")
config.train.update(dict(steps=steps, checkpoint_every=3, batch_size=8))
summary = train(config, workdir)
(record,) = evaluate(workdir, [32], max_tokens=2048)
print(json.dumps({{"processes": jax.process_count(), "devices": jax.device_count(), "step": summary["step"],
                  "nll": record["nll"]}}))
"""


def start_two_processes(script: str, workdir, steps) -> list:
    """The two processes of one job (jax.distributed on a free local port, 2 CPU devices each)
    running `script` (a WORKER_SCRIPT-like text) with (process id, port, workdir, steps)."""
    import os
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu", "LX_COMPILATION_CACHE": "off"}
    return [subprocess.Popen([sys.executable, "-c", script.format(repo=str(REPO)), str(i), port, str(workdir),
                              str(steps)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for i in range(2)]


def run_two_processes(tmp_path, workdir, steps):
    procs = start_two_processes(WORKER_SCRIPT, workdir, steps)
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


def test_two_processes_train_resume_and_evaluate_as_one(tmp_path):  # about 30 s on 2 cores
    from experiment.evals import evaluate
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


INTERRUPTED_WORKER = """
import json, sys
sys.path.insert(0, {repo!r})
process_id, port, workdir, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
from experiment.runtime import distributed, interrupts
distributed.initialize(f"127.0.0.1:{{port}}", 2, process_id)
from tests.conftest import tiny_config
from experiment.train import train
config = tiny_config("rope")
config.train.update(dict(steps=steps, checkpoint_every=10_000, log_every=5, batch_size=8))
with interrupts.deferred():
    try:
        summary = train(config, workdir)
        print(json.dumps({{"step": summary["step"]}}))
    except interrupts.Interrupted as e:
        print(json.dumps({{"interrupted": e.saved}}))
"""


def test_ctrl_c_in_one_process_stops_every_process_at_one_step(tmp_path):
    """A SIGINT that reaches one process of a job (the others never see it) stops them all at the same
    step, the next multiple of log_every, with one checkpoint there."""
    import os
    import re
    import signal
    import time
    workdir = tmp_path / "two"
    procs = start_two_processes(INTERRUPTED_WORKER, workdir, 100000)
    try:
        metrics = workdir / "metrics.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            time.sleep(0.2)
        os.kill(procs[1].pid, signal.SIGINT)  # the second process only, not the writer
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert all("interrupted" in r for r in results), results
    steps = {int(re.search(r"interrupted at step (\d+)", r["interrupted"]).group(1)) for r in results}
    assert len(steps) == 1, results
    (step,) = steps
    assert step % 5 == 0 and step >= 15
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [step]
