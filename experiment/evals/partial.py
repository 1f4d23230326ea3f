"""The answers of a generating evaluation's cell, kept batch by batch (RULER's cells, the generated
passkey's lengths): on a CPU one cell of long prompts takes up to hours, and a Ctrl-C, a `kill` or a
lost machine would otherwise lose every answer of it, since a record is written only when its cell
is complete.

Each batch's answers go to WORKDIR/eval/partial/<kind>-<digest>.json (written whole, atomically),
the digest taken over all that makes the cell: the record's header (checkpoint, method, overrides),
the settings and every prompt's tokens. The same command then goes on after the last batch kept:
answers are greedy, so a resumed cell gets the answers an uninterrupted one would (at the same batch
size), and its record's `seconds` add up the time of every attempt. The file is removed once the
cell's record is written; a cell asked with other settings or prompts has another digest and never
reads it.

Only a single-process job keeps answers (the processes of a larger one would have to agree on
where to resume; they start the cell again, as before).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
from typing import Sequence

import numpy as np

from experiment.store import files

log = logging.getLogger(__name__)

FOLDER = "partial"  # below the run's eval/


@dataclasses.dataclass
class Partial:
    """The kept answers of one cell (`answers`: JSON values, one per prompt, in prompt order) and the
    seconds spent on them before; `path` None: nothing is kept (not the writing process, or one
    process of several)."""
    path: pathlib.Path | None
    answers: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def open(cls, run, kind: str, identity: dict, prompts: Sequence[Sequence[int]]) -> "Partial":
        """The cell of `kind` that `identity` (JSON-able) and `prompts` (token ids) make, with whatever
        answers an earlier attempt kept."""
        import jax
        if not run.writer or jax.process_count() > 1:
            return cls(None)
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode())
        for ids in prompts:
            digest.update(np.asarray(ids, np.int64).tobytes() + b"|")
        path = run.eval_dir / FOLDER / f"{kind}-{digest.hexdigest()[:20]}.json"
        if not path.is_file():
            return cls(path)
        try:
            saved = json.loads(path.read_text())
            answers, seconds = list(saved["answers"]), float(saved["seconds"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("%s: unreadable (%s); the cell starts again", path, e)
            return cls(path)
        if len(answers) > len(prompts):
            log.warning("%s holds %d answers for %d prompts; the cell starts again", path, len(answers), len(prompts))
            return cls(path)
        log.info("%s: going on after the %d of %d answers kept (%.0f s spent on them)", path, len(answers),
                 len(prompts), seconds)
        return cls(path, answers, seconds)

    def add(self, answers: list, seconds: float) -> None:
        """Keep a batch's `answers`; `seconds`: all the time spent on the cell in this attempt so far."""
        self.answers.extend(answers)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomically(self.path, json.dumps({"answers": self.answers, "seconds": self.seconds + seconds}))

    def total_seconds(self, seconds: float) -> float:
        """The cell's time: this attempt's `seconds` and those of the attempts before."""
        return self.seconds + seconds

    def kept(self, total: int) -> str:
        """What an interruption leaves of this cell, for the line that says what is saved."""
        if self.path is None or not self.answers:
            return "no answer of it was kept yet"
        return (f"the answers of {len(self.answers)} of its {total} prompts are kept in {self.path}, and it goes on "
                f"from there")

    def close(self) -> None:
        """The cell's record is written: its kept answers are no longer needed."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
