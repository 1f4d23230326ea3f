"""The data x FSDP mesh on 8 simulated devices (XLA_FLAGS=--xla_force_host_platform_device_count=8,
in a subprocess) trains as one device does, with parameters and optimizer state sharded."""
import json

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from experiment.train import train
from tests.conftest import REPO, run_entry, tiny_config
from tests.helpers import EIGHT_DEVICES, losses, paper_config_shrunk, restored_params


MESH_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
import jax
from tests.conftest import tiny_config
from tests.helpers import paper_config_shrunk
from experiment import config as config_lib
from experiment.runtime import sharding
from experiment.train import loop, optimizer as optimizer_lib, train
out = {{"devices": jax.device_count()}}
for fsdp in (1, 2, 4):
    config = tiny_config("rope")
    config.train.update(dict(steps=3, checkpoint_every=3, batch_size=16, device_batch_tokens=16))  # 2 x 1 row
    config.mesh = dict(fsdp=fsdp)
    summary = train(config, sys.argv[1] + f"/fsdp{{fsdp}}")
    mesh = sharding.make_mesh(fsdp)
    tx = optimizer_lib.make_optimizer(config.train)
    _, params, opt_state, _, _ = loop.init_state(config_lib.resolve(config), 256, tx, mesh)
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
        # atol: 1/300 of one Adam step (lr 3e-3); Adam scales a near-zero gradient's sum-order noise up to
        # a step's size, so one parameter in ~100 can differ by ~1e-6 between meshes (seen in CI)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
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
