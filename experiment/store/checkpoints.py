"""Orbax checkpoints of one run: params, optimizer state, step and data position (three items, so
evaluation can read the parameters alone). Training and evaluation save and restore here; the run
folder itself (experiment/store/run.py) lists the steps without orbax, so that reports and config
files load no JAX."""
from __future__ import annotations

import contextlib
import gc
import logging
import pathlib
import sys
from typing import Any

import jax
import orbax.checkpoint as ocp

from experiment.store.files import check_meta, first_line, space_for
from experiment.store.run import RunDir, RunError

log = logging.getLogger(__name__)


def manager(workdir: pathlib.Path, max_to_keep: int = 2) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(pathlib.Path(workdir).absolute() / "checkpoints", options=options)


def manager_of(run: RunDir) -> ocp.CheckpointManager:
    """The run's one orbax manager (it caches the list of steps; a RunDir keeps it)."""
    if run.checkpoint_manager is None:
        run.checkpoint_manager = manager(run.path)
    return run.checkpoint_manager


def save(mngr: ocp.CheckpointManager, step: int, params: Any, opt_state: Any, meta: dict) -> None:
    """Synchronous save (an interrupted run must find it complete); `meta` is JSON (step, data position).
    A device without room for it is one line (files.NoSpace), checked before orbax starts its
    threads (each would print its own traceback), and whatever orbax raises that says so."""
    folder = pathlib.Path(mngr.directory) / str(step)
    needed = sum(int(getattr(leaf, "nbytes", 0)) for leaf in jax.tree.leaves((params, opt_state)))
    with space_for(folder, needed):
        mngr.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta)), force=True)
        mngr.wait_until_finished()


def _abstract(tree):
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def restore_step(mngr: ocp.CheckpointManager, params: Any, opt_state: Any | None = None,
                 step: int | None = None):
    """Restore into the structure (and shardings) of the templates; returns (params, opt_state, meta).
    With opt_state=None only the parameters and meta are read (evaluation)."""
    step = mngr.latest_step() if step is None else step
    items = {"params": ocp.args.StandardRestore(_abstract(params)), "meta": ocp.args.JsonRestore()}
    if opt_state is not None:
        items["opt_state"] = ocp.args.StandardRestore(_abstract(opt_state))
    restored = mngr.restore(step, args=ocp.args.Composite(**items))
    return restored["params"], restored.get("opt_state") if opt_state is not None else None, restored["meta"]


def restore(run: RunDir, params, opt_state=None, *, drop_damaged: bool = False, step: int | None = None):
    """(params, opt_state, meta) from the run's newest checkpoint that can be read: a damaged newer
    one is skipped with a warning (and deleted when `drop_damaged`, so that training can save that
    step again). If none can be read (or none fits the model), the newest one's error is raised."""
    mngr = manager_of(run)
    steps = sorted(mngr.all_steps(), reverse=True)
    if step is not None:
        if step not in steps:
            raise RunError(f"{run.checkpoints_dir} has no checkpoint at step {step}; it has {sorted(steps)}")
        steps = [step]
    failed: list[tuple[int, Exception]] = []
    for step in steps:
        try:
            with quiet_abandoned_reads():
                restored = restore_step(mngr, params, opt_state, step=step)
            check_meta(restored[2], step)
        except Exception as e:  # noqa: BLE001 - unreadable: try the one before
            failed.append((step, e))
            continue
        for bad, error in failed:
            log.warning("the checkpoint at step %d in %s cannot be read (%s); using step %d%s", bad,
                        run.checkpoints_dir, first_line(error), step,
                        " and deleting the damaged one" if drop_damaged else "")
            if drop_damaged:
                mngr.delete(bad)
        return restored
    if failed:
        newest = run.checkpoints_dir / str(failed[0][0])
        raise RunError(f"no checkpoint in {run.checkpoints_dir} can be read with this run's config.json ("
                       + "; ".join(f"step {s}: {first_line(e)}" for s, e in failed[:3])
                       + f"); if their files are damaged, delete them (rm -r {newest} ...): the same train.py "
                         f"command then starts the run again") from failed[0][1]
    raise RunError(f"{run.path} has no checkpoint yet; train first")


@contextlib.contextmanager
def quiet_abandoned_reads():
    """A failed orbax restore leaves its other reads' coroutines unawaited; Python would print each
    one's error with a page of TensorStore spec whenever they are collected (often much later).
    From the first failed restore on, those (and only those) are dropped quietly."""
    try:
        yield
    except Exception:
        if not getattr(sys.unraisablehook, "drops_orbax_reads", False):
            previous = sys.unraisablehook

            def hook(unraisable):
                code = getattr(unraisable.object, "cr_code", None)
                if code is None or "orbax" not in code.co_filename:
                    previous(unraisable)
            hook.drops_orbax_reads = True
            sys.unraisablehook = hook
        gc.collect()
        raise
