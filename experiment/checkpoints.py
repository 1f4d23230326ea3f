"""Orbax checkpoints of one run: params, optimizer state, step and data position (three items, so
evaluation can read the parameters alone)."""
from __future__ import annotations

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp


def manager(workdir: pathlib.Path, max_to_keep: int = 2) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(pathlib.Path(workdir).absolute() / "checkpoints", options=options)


def save(mngr: ocp.CheckpointManager, step: int, params: Any, opt_state: Any, meta: dict) -> None:
    """Synchronous save (an interrupted run must find it complete); `meta` is JSON (step, data position)."""
    mngr.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
        meta=ocp.args.JsonSave(meta)), force=True)
    mngr.wait_until_finished()


def _abstract(tree):
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def restore(mngr: ocp.CheckpointManager, params: Any, opt_state: Any | None = None,
            step: int | None = None):
    """Restore into the structure (and shardings) of the templates; returns (params, opt_state, meta).
    With opt_state=None only the parameters and meta are read (evaluation)."""
    step = mngr.latest_step() if step is None else step
    items = {"params": ocp.args.StandardRestore(_abstract(params)), "meta": ocp.args.JsonRestore()}
    if opt_state is not None:
        items["opt_state"] = ocp.args.StandardRestore(_abstract(opt_state))
    restored = mngr.restore(step, args=ocp.args.Composite(**items))
    return restored["params"], restored.get("opt_state") if opt_state is not None else None, restored["meta"]
