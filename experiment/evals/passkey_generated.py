"""The passkey's generated form (experiment/evals/passkey.py, `--passkey_form generated`): the instructed
prompts of corpora/passkey.py, each answer generated greedily with the key / value cache
(models/generate.py) by the model under the evaluated method, and scored by exact match of its first
number. A real model answers a question; the compact form's teacher-forced digits are for the small
models trained here. `--passkey_form chat` puts the same prompt in the model's chat template
(`chat_frame`: the instruction, filler and question as the user's message, "The passkey is" after the
assistant's turn begins).

Records (kind `passkey`, `form` "generated" or "chat") hold, beside the compact form's fields, each prompt's
`outputs` (the generated text), `prompt_tokens`, `new_tokens` (at most) and `seconds` (the cell's
wall time, over every attempt: prefill dominates). A length's answers are kept batch by batch
(experiment/evals/partial.py): an interrupted length goes on from them.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time

import numpy as np

from corpora import passkey as task
from experiment.evals.common import Scoring
from experiment.evals.partial import Partial
from experiment.evals.spread import Spread
from experiment.runtime import interrupts
from experiment.runtime.progress import Progress

log = logging.getLogger(__name__)


def evaluate_generated(scoring: Scoring, spec, batch_tokens: int) -> list[dict]:
    """Records of every (length, depth) of `spec` (experiment/evals/passkey.py's PasskeySpec), each length
    written as it finishes."""
    from models.generate import generate
    config, tokenizer = scoring.config, scoring.tokenizer
    frame = chat_frame(scoring.run, tokenizer) if spec.form == "chat" else None
    model = scoring.model()
    new = task.answer_tokens(spec.digits)
    stop = [int(tokenizer.eos_id), "\n", "."]  # " 48213." ends at its period
    spread = Spread(model, lambda m, batch: generate(m, batch, new, stop=stop, tokenizer=tokenizer), new)
    fields = {**scoring.header(), "form": spec.form, "digits": spec.digits, "seed": spec.seed,
              "chance": 10.0 ** -spec.digits, "passkey_fraction": float(config.data.passkey_fraction),
              "new_tokens": new}
    method = f" {scoring.method}" if scoring.method else ""
    results, done = [], []
    for length in scoring.lengths:
        interrupts.check(functools.partial(scoring.interrupted, "passkey", list(done), length))
        examples = _examples(tokenizer, length - new, spec, int(config.train.seq_len), frame)
        rows = max(1, min(len(examples), batch_tokens // length))
        partial = Partial.open(scoring.run, "passkey", {**fields, "eval_length": int(length),
                                                        "depths": list(spec.depths), "per_cell": spec.per_cell,
                                                        **({"distances": list(spec.distances)}
                                                           if spec.distances else {})},
                               [e.ids for e in examples])
        stopped = functools.partial(_stopped, scoring, list(done), length, partial, len(examples))
        start = time.perf_counter()
        with Progress(f"passkey ({spec.form}){method} L={length}", len(examples), "prompts",
                      shown=scoring.run.writer) as progress:
            if partial.answers:
                progress.update(len(partial.answers))
            batches = [[e.ids for e in examples[lo:lo + rows]] for lo in range(len(partial.answers), len(examples), rows)]
            interrupts.check(stopped)
            for batch, ids in zip(batches, spread.answers(batches)):  # over every device and process
                partial.add([tokenizer.decode(x) for x in ids], time.perf_counter() - start)
                progress.update(len(batch))
                interrupts.check(stopped)
        seconds = partial.total_seconds(time.perf_counter() - start)
        outputs = list(partial.answers)
        interrupts.check(stopped)
        cells = cell_records(examples, outputs, length, seconds, fields)
        log.info("passkey (%s)%s L=%d: accuracy %s (%.0f s)", spec.form, method, length,
                 ", ".join(f"{r.get('distance') or format(r['depth'], 'g')}: {r['accuracy']:.2f}" for r in cells),
                 seconds)
        results.extend(cells)
        scoring.write("passkey", cells)
        partial.close()
        done.append(length)
    return results


def _examples(tokenizer, prompt_length: int, spec, window: int, frame) -> list[task.PromptedExample]:
    """The prompts of one length: `spec.per_cell` at each depth, or with `spec.distances` at each distance
    from the prompt's end (example i has the same key, and seed, at every depth or distance)."""
    if not spec.distances:
        return task.instructed_batch(tokenizer, prompt_length, list(spec.depths), spec.per_cell, spec.seed,
                                     spec.digits, frame)
    from experiment.evals.ruler import distance_tokens
    return [dataclasses.replace(task.instructed_at_distance(
                tokenizer, prompt_length, distance_tokens(d, window, "--passkey_distances"),
                task.example_seed(spec.seed, i), spec.digits, frame), distance=d)
            for d in spec.distances for i in range(spec.per_cell)]


def _stopped(scoring: Scoring, done: list[int], length: int, partial: Partial, total: int) -> str:
    """What a Ctrl-C within a length leaves: the records of the lengths done and its kept answers."""
    return f"{scoring.interrupted('passkey', done, length)} (L={length}: {partial.kept(total)})"


MESSAGE = "\x00passkey prompt\x00"  # where the user's message goes: no template writes it


def chat_frame(run, tokenizer) -> task.ChatFrame:
    """The run's chat template around one user message, in its tokens (the template's own special
    tokens read as such); a ValueError naming the option where the run has no template."""
    from experiment.evals.ruler import text_of
    text = text_of(run, tokenizer, "chat")
    if not text.chat_template:
        raise ValueError(f"--passkey_form chat: {run.path} has no chat template (chat_template.jinja); import the "
                         f"checkpoint with its template, or use --passkey_form generated")
    rendered = text.chat([{"role": "user", "content": MESSAGE}])
    if rendered.count(MESSAGE) != 1:
        raise ValueError(f"--passkey_form chat: the chat template of {run.path} does not write the user's message "
                         f"once; use --passkey_form generated")
    head, tail = rendered.split(MESSAGE)
    return task.ChatFrame(np.asarray(text.encode(head, special=False), np.int32),
                          np.asarray(text.encode(tail, special=False), np.int32))


def cell_records(examples: list[task.PromptedExample], outputs: list[str], length: int, seconds: float,
                 fields: dict) -> list[dict]:
    """One record per depth (or per distance of keys placed by design: `placement` "designed", its
    `distance` as asked, each example's `distances` in tokens and `depth` their mean fraction of the
    filler): accuracy (exact match of the first number generated), the outputs."""
    out = []
    designed = examples[0].distance is not None
    places = list(dict.fromkeys(e.distance for e in examples)) if designed else sorted({e.depth for e in examples})
    for place in places:
        chosen = [(e, text) for e, text in zip(examples, outputs) if (e.distance if designed else e.depth) == place]
        right = [task.generated_answer(text) == e.answer for e, text in chosen]
        where = ({"depth": float(np.mean([e.depth for e, _ in chosen])), "placement": "designed", "distance": place,
                  "distances": [int(len(e.ids) - e.key_position) for e, _ in chosen]} if designed
                 else {"depth": float(place)})
        out.append({"task": "passkey", "eval_length": int(length), **where,
                    "accuracy": sum(right) / len(right), "count": len(right), **fields,
                    "prompt_tokens": int(len(chosen[0][0].ids)), "outputs": [text for _, text in chosen],
                    "seconds": round(seconds * len(chosen) / len(examples), 2)})
    return out
