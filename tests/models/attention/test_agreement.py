"""Hosts agree (issue 68, item 3): what the device check, search and race decide is process 0's on every
process of a job, so that every process traces the same program; two local processes (jax.distributed
over 127.0.0.1, gloo), each told to decide otherwise, end with process 0's decision, inside a trace too."""
import json

import jax
import pytest

from models.attention.agreement import agreed
from tests.experiment.runtime.test_distributed import start_two_processes

SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
process_id, port = int(sys.argv[1]), sys.argv[2]
from experiment.runtime import distributed
distributed.initialize(f"127.0.0.1:{{port}}", 2, process_id)
import jax, jax.numpy as jnp
from models.attention import agreement, choice, cpu_flash
from models.config import ModelConfig
from tests.models.attention.test_verify import _scheme
mine = {{"process": jax.process_index(), "launch": {{"block": 16 * (1 + jax.process_index())}}}}
plain = agreement.agreed(lambda: mine)
inside = []
jax.jit(lambda x: inside.append(agreement.agreed(lambda: mine)) or x).trace(jnp.zeros(2))
cpu_flash.usable = lambda: jax.process_index() == 0  # as if only host 0 could build the CPU kernel
picked = choice.choose(ModelConfig(attention="auto"), _scheme("rope"), jnp.arange(4096)[None], jnp.float32,
                       dropping=False)
print(json.dumps({{"plain": plain, "inside": inside[0], "picked": picked}}))
"""


@pytest.mark.slow  # ~28 s on 2 cores: two processes start JAX (the default run keeps test_distributed's pair)
def test_every_process_takes_process_0s_decision(tmp_path):
    procs = start_two_processes(SCRIPT, tmp_path, 0)
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    first = {"process": 0, "launch": {"block": 16}}
    assert [g["plain"] for g in got] == [first, first] and [g["inside"] for g in got] == [first, first]
    assert got[0]["picked"] == got[1]["picked"] == "cpu_flash", got  # host 1 alone would have picked another


def test_one_process_decides_for_itself():
    assert jax.process_count() == 1
    assert agreed(lambda: {"a": [1, 2.5, "x"]}) == {"a": [1, 2.5, "x"]}
