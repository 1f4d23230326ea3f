"""generate.py --prompts_file: many prompts, cut into batches of `--batch_size` in file order, the batches
spread over every device and process of the job (experiment/evals/spread.py: a round holds one batch for
each device, each batch exactly what one device would run), each prompt's continuation a line of the
`--out` JSON Lines file, written in prompt order after each round (by process 0):

    {"index": 0, "prompt": "...", "prompt_tokens": 12, "text": "...", "new_tokens": 32}

The prompts file holds one prompt a line: a JSON string, or an object with a "prompt" string (other
keys are ignored). A batch whose first prompt is prompt i samples with seed `--seed + i // batch_size`
(greedy ignores it), so the lines do not depend on how many devices or processes ran them. A run
stopped part-way (Ctrl-C, a kill) keeps the lines written; the same command goes on after them (a last
line cut short is dropped), and refuses an --out written for other prompts.
"""
from __future__ import annotations

import json
import pathlib
from typing import Callable, Sequence

from experiment.runtime import interrupts
from experiment.runtime.progress import Progress


def read_prompts(path: str | pathlib.Path) -> list[str]:
    """The prompts of a JSON Lines file (one JSON string or {"prompt": str} a line; blank lines skipped)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"--prompts_file {path}: no such file")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise ValueError(f"--prompts_file {path}, line {number}: not JSON ({e.msg}); give one prompt a line as a "
                             f"JSON string (\"text\") or an object with a \"prompt\" string") from None
        prompt = value.get("prompt") if isinstance(value, dict) else value
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"--prompts_file {path}, line {number}: no prompt text; give a JSON string or an object "
                             f"with a non-empty \"prompt\" string")
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"--prompts_file {path}: no prompts in it")
    return prompts


def written(out: pathlib.Path, prompts: Sequence[str]) -> int:
    """How many of `prompts` `out` holds already, in order (a last line cut short is dropped from the
    file); ValueError where a line is for another prompt."""
    if not out.exists():
        return 0
    lines = out.read_text(encoding="utf-8").splitlines()
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            kept.append(json.loads(line))
        except ValueError:
            if number < len(lines):
                raise ValueError(f"--out {out}, line {number}: not JSON; move the file away to start again") from None
    if len(kept) < len(lines):  # an append cut short
        out.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    for i, record in enumerate(kept):
        if i >= len(prompts) or record.get("index") != i or record.get("prompt") != prompts[i]:
            raise ValueError(f"--out {out} holds line {i + 1} for another prompt than --prompts_file's prompt "
                             f"{i + 1}; give another --out (or remove it to start again)")
    return len(kept)


def generate_many(model, prompts: Sequence[str], ids: Sequence[Sequence[int]], out: pathlib.Path, *,
                  decode: Callable, batch_size: int, max_new_tokens: int, seed: int = 0, **options) -> int:
    """The continuations of `prompts` (`ids`: their tokens) into `out`, resuming after the lines there;
    `options`: models.generate.generate's (temperature, top_p, stop, tokenizer). Returns how many were
    generated now."""
    import jax

    from experiment.evals.spread import Spread
    from models.generate import generate
    out = pathlib.Path(out)
    start = _agreed(written(out, prompts) if jax.process_index() == 0 else 0)
    firsts = list(range(start, len(prompts), batch_size))
    batches = [_Batch([list(x) for x in ids[lo:lo + batch_size]], seed + lo // batch_size) for lo in firsts]
    spread = Spread(model, lambda m, batch: generate(m, list(batch), max_new_tokens, seed=batch.seed, **options),
                    max_new_tokens)
    done = start
    with Progress("generating", len(prompts), "prompts") as progress:
        progress.update(start)
        for lo, answers in zip(firsts, spread.answers(batches)):
            lines = [{"index": lo + r, "prompt": prompts[lo + r], "prompt_tokens": len(ids[lo + r]),
                      "text": decode(new), "new_tokens": len(new)} for r, new in enumerate(answers)]
            if jax.process_index() == 0:
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a", encoding="utf-8") as f:
                    f.write("".join(json.dumps(line) + "\n" for line in lines))
            done = lo + len(answers)
            progress.update(len(answers))
            interrupts.check(f"interrupted after {done} of {len(prompts)} prompts; their continuations are in {out}, "
                             f"and the same command goes on after them")
    return done - start


class _Batch(list):
    """A batch's prompts (token ids) and the seed it samples with, whichever device runs it."""

    def __init__(self, rows, seed: int):
        super().__init__(rows)
        self.seed = seed


def _agreed(count: int) -> int:
    """Process 0's count in every process (the others may not see its --out)."""
    import jax
    if jax.process_count() == 1:
        return count
    import numpy as np
    from jax.experimental import multihost_utils
    return int(multihost_utils.broadcast_one_to_all(np.int32(count)))
