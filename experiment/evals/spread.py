"""Generating evaluations (RULER, the generated passkey) spread over every device and process of the
job, data parallel: the prompts come in batches (as one device would take them), a round holds one
batch for each device of each process, each process runs its batches of the round on its own devices
(a replica of the model on each, one thread each: JAX runs them at once), and the answers of the round
are gathered in every process (jax.distributed's allgather) and handed on in the batches' order. Each
batch is the same batch that one device would run, on a copy of the same weights, so greedy answers
and the records are those of one process on one device, in the same order (tests/experiment/evals/
test_spread.py: 8 devices and 2 processes against one).

One device in one process (the usual case on a CPU) runs the batches one after the other as before,
with no thread and no copy of the model.
"""
from __future__ import annotations

import concurrent.futures
from typing import Callable, Iterator, Sequence

import jax
import numpy as np

from models.attention import agreement

Batch = Sequence[Sequence[int]]
Answers = list[list[int]]


def workers() -> int:
    """Batches a round takes: every device of every process."""
    return jax.local_device_count() * jax.process_count()


class Spread:
    """`answers(batches)`: each batch's new token ids by `ask(model, batch)`, in order, a round at a time."""

    def __init__(self, model, ask: Callable[[object, Batch], Answers], max_new: int):
        self.model, self.ask, self.max_new = model, ask, max_new
        self.devices = jax.local_devices()
        self._replicas: list | None = None

    def replicas(self) -> list:
        """A copy of the model's weights on each local device, made at the first round."""
        if self._replicas is None:
            from flax import nnx
            graphdef, state = nnx.split(self.model)
            state = jax.tree.map(_here, state)
            self._replicas = [nnx.merge(graphdef, jax.device_put(state, d)) for d in self.devices]
        return self._replicas

    def answers(self, batches: Sequence[Batch]) -> Iterator[Answers]:
        """Each batch's answers, in the batches' order (yielded as each round completes)."""
        if workers() == 1:
            for batch in batches:
                yield self.ask(self.model, batch)
            return
        per_round = workers()
        for lo in range(0, len(batches), per_round):
            yield from self._round(list(batches[lo:lo + per_round]))

    def _round(self, batches: list[Batch]) -> list[Answers]:
        """Batch k of the round runs in process k % P on its local device k // P."""
        p, count = jax.process_index(), jax.process_count()
        mine = [(k // count, batch) for k, batch in enumerate(batches) if k % count == p]
        replicas = self.replicas()

        def run(slot: int, batch: Batch) -> Answers:
            with jax.default_device(self.devices[slot]):
                return self.ask(replicas[slot], batch)
        with agreement.each_process_alone():  # each process's programs are its own: no broadcast pairs up
            if len(mine) <= 1:
                local = {slot: run(slot, batch) for slot, batch in mine}
            else:
                with concurrent.futures.ThreadPoolExecutor(max_workers=len(mine)) as pool:
                    futures = {slot: pool.submit(run, slot, batch) for slot, batch in mine}
                    local = {slot: f.result() for slot, f in futures.items()}
        if count == 1:
            return [local[k] for k in range(len(batches))]
        gathered = self._gather(local, max(len(b) for b in batches))  # P x slots x rows x max_new
        return [_unpad(gathered[k % count, k // count][:len(batch)]) for k, batch in enumerate(batches)]

    def _gather(self, local: dict[int, Answers], rows: int) -> np.ndarray:
        """Every process's answers of the round, padded with -1 to one shape (the allgather needs it)."""
        from jax.experimental import multihost_utils
        out = np.full((len(self.devices), rows, self.max_new), -1, np.int32)
        for slot, answers in local.items():
            for r, ids in enumerate(answers):
                out[slot, r, :len(ids)] = ids
        return np.asarray(multihost_utils.process_allgather(out))


def _here(x):
    """A weight as this process can copy it to its devices: itself where every shard is here, one shard
    where it is replicated over the processes, else gathered from them (a collective: each process
    takes the model's weights in the same order)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return x
    if x.is_fully_replicated:
        return x.addressable_data(0)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _unpad(rows: np.ndarray) -> Answers:
    return [[int(t) for t in row if t >= 0] for row in rows]
