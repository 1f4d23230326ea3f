"""Generating evaluations over every device and process (experiment/evals/spread.py, issue 68 item 5):
the batches' answers in their order; RULER on 8 simulated devices and on 2 processes of 2 devices each
(jax.distributed on 127.0.0.1, gloo) writes the records one process on one device writes."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from experiment.evals import kinds as kinds_lib
from experiment.evals import spread
from tests.conftest import REPO
from tests.experiment.evals.test_ruler import train_tiny_run
from tests.experiment.runtime.test_distributed import start_two_processes
from tests.helpers import EIGHT_DEVICES


def test_one_device_answers_the_batches_in_order_without_a_copy_of_the_model():
    asked = []

    def ask(model, batch):
        asked.append(model)
        return [[len(ids), ids[0]] for ids in batch]
    got = list(spread.Spread("the model", ask, max_new=2).answers([[[1, 2], [3]], [[4, 5, 6]]]))
    assert got == [[[2, 1], [1, 3]], [[3, 4]]] and asked == ["the model", "the model"]
    assert spread._unpad([[5, 7, -1], [-1, -1, -1]]) == [[5, 7], []]


OPTIONS = {"ruler_tasks": ("niah_single_1",), "samples": 6, "needle_distances": ("300", "700")}
EVALUATE = """
import faulthandler, json, sys
faulthandler.dump_traceback_later(500, exit=True)  # a hang says where
sys.path.insert(0, {repo!r})
process_id, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
from experiment.runtime import distributed
if port != "-":
    distributed.initialize(f"127.0.0.1:{{port}}", 2, process_id)
import jax
from experiment.evals import kinds
request = kinds.Request(lengths=(1024,), options={options!r}, methods=("direct", "yarn"), batch_tokens=2048)
out = kinds.evaluate_kinds(workdir, ("ruler",), request)["ruler"]
print(json.dumps({{"devices": jax.device_count(), "records": out}}))
"""


def _records(out: list[dict]) -> list[tuple]:
    return [(r["method"], r["answers"], r["scores"], r["distances"], r["answer_tokens"]) for r in out]


@pytest.mark.slow  # a tiny training, then RULER four times (one, 8 and 2 x 2 devices): ~2 min on 2 cores
def test_ruler_on_eight_devices_and_on_two_processes_writes_one_devices_records(tmp_path):
    trained = train_tiny_run(tmp_path)
    runs = {name: tmp_path / name for name in ("one", "eight", "two")}
    for run in runs.values():
        shutil.copytree(trained, run)
    one = kinds_lib.evaluate_kinds(runs["one"], ("ruler",), kinds_lib.Request(
        lengths=(1024,), options=OPTIONS, methods=("direct", "yarn"), batch_tokens=2048))["ruler"]
    assert len(one) == 2 and all(r["count"] == 6 for r in one)  # 3 batches of 2 prompts a method
    # {repo} left for start_two_processes to fill (the options' braces doubled, as format wants)
    template = EVALUATE.replace("{options!r}", repr(OPTIONS).replace("{", "{{").replace("}", "}}"))
    done = subprocess.run([sys.executable, "-c", template.format(repo=str(REPO)), "0", "-", str(runs["eight"])],
                          cwd=REPO, text=True, capture_output=True, env={**os.environ, **EIGHT_DEVICES}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    eight = json.loads(done.stdout.strip().splitlines()[-1])
    assert eight["devices"] == 8 and _records(eight["records"]) == _records(one)
    procs = start_two_processes(template, runs["two"], 0)
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    two = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert two[0]["devices"] == 4 and all(_records(t["records"]) == _records(one) for t in two)
    written = json.loads((runs["two"] / "eval" / "ruler.json").read_text())  # by process 0 alone
    assert _records(written) == _records(one)
