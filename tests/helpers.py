"""Helpers the tests share: configs, one training update, and what a run directory holds (read
through RunDir and the checkpoint module, never by hand-written paths)."""
from __future__ import annotations

import json

import jax
import numpy as np
from flax import nnx

import corpora
from configs import wikitext103
from experiment import config as config_lib
from experiment.model import build_model
from experiment.runtime import sharding
from experiment.store import checkpoints
from experiment.store.run import RunDir
from experiment.train import loop, optimizer as optimizer_lib, step as step_lib
from tests.conftest import SHARED_WIKITEXT

EIGHT_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


def one_update(config, micro_steps: int):
    """Parameters after one update of `config` on one device, and the step's metrics."""
    config = config_lib.resolve(config)
    tc = config.train
    mesh = sharding.make_mesh(1, jax.devices()[:1])
    tx = optimizer_lib.make_optimizer(tc)
    graphdef, params, opt_state, shards, scheme = loop.init_state(config, 256, tx, mesh)
    step = step_lib.make_train_step(graphdef, tx, 7, micro_steps=micro_steps,
                                    per_example_keys=step_lib.is_stochastic(config.model, scheme),
                                    grad_shardings=shards, rng_impl=tc.dropout_rng)
    stream = np.random.default_rng(0).integers(0, 256, 5000)
    inputs, targets = corpora.train_batch(stream, 0, tc.batch_size, tc.seq_len, 0)
    params, _, metrics = step(params, opt_state, inputs, targets, np.int32(0))
    return params, jax.device_get(metrics)


def paper_config_shrunk():
    """configs/wikitext103.py as it is (the paper's 144 x 512 update, 9,216 tokens per device,
    dropout, NAG, adaptive input / softmax), with a small model, trained one step on WikiText-103's
    validation split."""
    config = wikitext103.get_config("alibi,512")
    config.data.update(dict(source="local", path=str(SHARED_WIKITEXT / "wikitext-103"), train_split="valid"))
    config.model.update(dict(num_layers=2, d_model=32, num_heads=4, mlp_dim=64, adaptive_cutoffs=(2000, 10000)))
    config.train.update(dict(steps=1, checkpoint_every=1, warmup_steps=1))
    return config


def losses(workdir) -> list[float]:
    """The logged training losses of a run, in order."""
    return [json.loads(line)["loss"] for line in RunDir(workdir).metrics_path.read_text().splitlines()]


def restored_params(workdir, config, vocab_size=256):
    """The parameters of a run's newest checkpoint, in the structure `config`'s model has."""
    config = config_lib.resolve(config)
    template = nnx.split(build_model(config, vocab_size))[1]
    params, _, _ = checkpoints.restore(RunDir(workdir), template)
    return params


def read_only_below(monkeypatch, folder) -> None:
    """The lock module's os.open fails as on a read-only file system for every path under `folder`."""
    import errno
    import os

    from experiment.store import lock
    real_open = os.open

    def read_only(path, *args):
        if str(path).startswith(str(folder)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args)
    monkeypatch.setattr(lock.os, "open", read_only)
