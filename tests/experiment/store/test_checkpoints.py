"""Orbax checkpoints of a run (experiment/store/checkpoints.py): a device without room for the first
checkpoint is one line naming it, not pages of orbax's thread tracebacks."""
import errno
import shutil

import jax.numpy as jnp
import pytest

from experiment.store import checkpoints, files

PARAMS = {"w": jnp.zeros((1000, 1000))}  # 4 MB
OPT_STATE = {"m": jnp.zeros((1000, 1000))}


def test_a_full_device_at_the_first_checkpoint_is_one_line_naming_it(tmp_path, monkeypatch):
    from experiment.store.files import NoSpace
    mngr = checkpoints.manager(tmp_path)
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(NoSpace, match=rf"^no space left on device: {tmp_path.absolute() / 'checkpoints' / '0'} "
                                      r"\(8 MB needed\)$"):
        checkpoints.save(mngr, 0, PARAMS, OPT_STATE, {"step": 0, "data_position": 0})  # before orbax starts
    monkeypatch.undo()

    def full(*args, **kwargs):  # what orbax raises when a write of one of its threads fails
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise ValueError("Failed to commit checkpoint") from e
    monkeypatch.setattr(mngr, "save", full)
    with pytest.raises(NoSpace, match=r"^no space left on device: .*checkpoints/0 \(8 MB needed\)$"):
        checkpoints.save(mngr, 0, PARAMS, OPT_STATE, {"step": 0, "data_position": 0})
