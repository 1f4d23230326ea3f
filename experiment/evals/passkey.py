"""Passkey retrieval accuracy at many lengths and depths (corpora/passkey.py builds the task), in one of
three forms (`--passkey_form`, recorded as each record's `form`; reports never mix them):
- compact (the default; the small models trained here): filler, "key 4821.", filler, "key"; an example
  counts as correct iff the model's argmax at every answer position is the answer token, teacher
  forced: the same as greedy decoding producing the answer after the final cue.
- generated (a real model): an instruction first (no key at token 0), the key sentence inside the
  filler, a question; the answer generated greedily with the key / value cache (models/generate.py,
  under the method evaluated) and correct iff its first number is the key (exact match). The prompt
  and the new tokens together make the evaluation length.
- chat (a real model with a chat template): the generated form's prompt as the user's message of the
  model's chat template (the run's chat_template.jinja), the answer prefix after the assistant's turn
  begins; scored as the generated form is.
Each (eval_length, depth) cell scores `per_cell` examples; example i has the same key in every cell.

Records (kind `passkey`, WORKDIR/eval/passkey.json; experiment/store/records.py): one per (eval_length,
depth, digits, overrides), merged with what the file holds, each length as it finishes.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import pathlib
from typing import Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from corpora import passkey as task
from experiment.evals.common import Scoring, apply_overrides, window_positions
from experiment.evals.kinds import EvalKind, Option, Request, Target, evaluate_kinds, same_evaluation
from experiment.evals.ruler import distance_tokens
from experiment.runtime import interrupts, sharding
from experiment.runtime.progress import Progress
from experiment.store.records import PASSKEY_FORMS, PASSKEY_GENERATED, passkey_form
from experiment.store.run import RunDir
from posenc.domains import at_least, between, unit_interval

log = logging.getLogger(__name__)

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclasses.dataclass(frozen=True)
class Scores:
    """Per example: `exact` (every answer token right) and `token_accuracy` (the fraction right)."""
    exact: np.ndarray
    token_accuracy: np.ndarray


def score_examples(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], batch: task.PasskeyBatch,
                   batch_size: int | None = None) -> Scores:
    """Score a passkey batch with `fn(inputs_BxL, rows_B)`, which returns logits B x L x V (or the
    argmax ids, B x L) for those inputs; `rows_B` are the examples' indices in `batch` (a fake model
    in a test can look its targets up; the real one draws per-example positions from them).
    Calls `fn` on `batch_size` rows at a time (default: all), the last call padded with copies of
    the last example so that every call has one shape (one compilation)."""
    n = len(batch)
    if n == 0:
        return Scores(np.zeros(0, bool), np.zeros(0))
    size = batch_size or n
    predicted = np.zeros(batch.targets.shape, np.int64)
    for lo in range(0, n, size):
        rows = np.minimum(np.arange(lo, lo + size), n - 1)
        out = np.asarray(fn(batch.inputs[rows], rows.astype(np.int32)))
        ids = out.argmax(-1) if out.ndim == 3 else out
        keep = min(size, n - lo)
        predicted[lo:lo + keep] = ids[:keep]
    right = (predicted == batch.targets) & batch.answer_mask
    per_example = batch.answer_mask.sum(axis=1)
    return Scores(exact=right.sum(axis=1) == per_example, token_accuracy=right.sum(axis=1) / per_example)


def cell_records(batch: task.PasskeyBatch, scores: Scores, length: int, **fields) -> list[dict]:
    """One record per depth of a batch of one length."""
    out = []
    for depth in sorted(set(batch.depths.tolist())):
        sel = batch.depths == depth
        out.append({"task": "passkey", "eval_length": int(length), "depth": float(depth),
                    "accuracy": float(scores.exact[sel].mean()),
                    "token_accuracy": float(scores.token_accuracy[sel].mean()),
                    "count": int(sel.sum()), **fields})
    return out


@dataclasses.dataclass(frozen=True)
class PasskeySpec:
    """What to ask: examples per (length, depth) cell, the examples' seed and the key's digits."""
    depths: tuple[float, ...] = DEPTHS
    per_cell: int = 20
    seed: int = 1234
    digits: int | None = None  # None: the run's data.passkey_digits (compact), 5 (generated)
    form: str = PASSKEY_FORMS[0]  # FORMS; GENERATED: the answer generated
    distances: tuple[str, ...] = ()  # keys placed by distance from the prompt's end (in place of depths)


def evaluate_passkey(workdir: str | pathlib.Path | RunDir, lengths: Sequence[int] | None = None,
                     spec: PasskeySpec = PasskeySpec(),
                     *, batch_tokens: int | None = None, skip_impossible: bool = False,
                     overrides: dict[str, str] | None = None) -> list[dict]:
    """Passkey accuracy of the run's newest checkpoint at each (length, depth; lengths None: the
    run's config.eval.lengths); records written to WORKDIR/eval/passkey.json and returned. A
    length the scheme cannot encode raises its LengthError, or is skipped with a warning when
    `skip_impossible`; a length too short for the task raises PasskeyError. `overrides` switch
    eval-time knobs as in evals.perplexity.evaluate (None: none). One kind of evaluate_kinds."""
    request = Request(tuple(lengths) if lengths else None, dict(overrides or {}), batch_tokens, skip_impossible,
                      spec_options(spec))
    return evaluate_kinds(workdir, ("passkey",), request)["passkey"]


def spec_options(spec: PasskeySpec) -> dict:
    """The request options (eval_extrapolate.py's flags) that ask for `spec`."""
    return {"passkey_depths": tuple(spec.depths), "passkey_per_cell": spec.per_cell, "passkey_seed": spec.seed,
            "passkey_digits": spec.digits, "passkey_form": spec.form}


def checked_spec(run: RunDir, config, lengths: list[int], spec: PasskeySpec, overrides: dict) -> PasskeySpec:
    """`spec` with its digits resolved (the run's data.passkey_digits where None), every value
    checked before any checkpoint is read: depths in [0, 1], per_cell and digits >= 1, and each
    length long enough for the task (PasskeyError)."""
    depths = tuple(float(d) for d in spec.depths)
    if not lengths or not depths or spec.per_cell < 1 or any(not 0 <= d <= 1 for d in depths):
        raise ValueError(f"passkey needs lengths, depths in [0, 1] (0 = start, 1 = just before the question) and "
                         f"per_cell >= 1, got lengths {lengths}, depths {list(depths)}, per_cell {spec.per_cell}")
    if spec.form not in FORMS:
        raise ValueError(f"--passkey_form: one of {', '.join(FORMS)}, got {spec.form!r}")
    checked = apply_overrides(config, overrides)
    default = task.INSTRUCTED_DIGITS if spec.form in GENERATED else checked.data.passkey_digits
    digits = int(default if spec.digits is None else spec.digits)
    if digits < 1:
        raise ValueError(f"passkey digits must be >= 1, got {digits}")
    tokenizer = run.tokenizer(checked.data, write=False)
    frame = None
    if spec.form == "chat":
        from experiment.evals.passkey_generated import chat_frame
        frame = chat_frame(run, tokenizer)
    if spec.distances:
        if spec.form not in GENERATED:
            raise ValueError("--passkey_distances places the key of the generated and chat forms; add "
                             "--passkey_form generated (or chat)")
        window = int(checked.train.seq_len)
        for length in lengths:
            prompt_length = length - task.answer_tokens(digits)
            for text in spec.distances:
                distance = distance_tokens(text, window, "--passkey_distances")
                try:
                    task.instructed_at_distance(tokenizer, prompt_length, distance, spec.seed, digits, frame)
                except task.PasskeyError as e:
                    raise task.PasskeyError(f"--passkey_distances {text} at --lengths {length} ({prompt_length:,} "
                                            f"tokens of prompt): {e}") from None
    for length in lengths:
        if spec.form in GENERATED:  # an evaluation length holds the prompt and the answer's tokens
            prompt, answer = task.instructed_minimum(tokenizer, spec.seed, digits, frame), task.answer_tokens(digits)
            if length < prompt + answer:
                raise task.PasskeyError(
                    f"--lengths {length}: the {spec.form} passkey needs L >= {prompt + answer} tokens (a prompt of at "
                    f"least {prompt} and {answer} kept for the answer: {digits} digits + 4); give lengths >= "
                    f"{prompt + answer}")
            task.instructed_example(tokenizer, length - answer, 0.5, spec.seed, digits, frame)
        else:
            task.passkey_example(tokenizer, length, 0.5, spec.seed, digits)
    return dataclasses.replace(spec, depths=depths, digits=digits)



def _evaluate_passkey(scoring: Scoring, spec: PasskeySpec, batch_tokens: int) -> list[dict]:
    if spec.form in GENERATED:
        from experiment.evals.passkey_generated import evaluate_generated
        return evaluate_generated(scoring, spec, batch_tokens)
    config, graphdef = scoring.config, scoring.graphdef
    batches = {length: task.passkey_batch(scoring.tokenizer, length, list(spec.depths), spec.per_cell, spec.seed,
                                          spec.digits) for length in scoring.lengths}

    @functools.partial(jax.jit, out_shardings=NamedSharding(scoring.mesh, P()))  # every host gets every row
    def predict(params, inputs, rows):
        model = nnx.merge(graphdef, params)
        positions = window_positions(model.scheme, config, rows, inputs.shape[1])  # randomized: per example
        return model.next_tokens(inputs, positions)

    batch_sharding = sharding.batch_sharding(scoring.mesh)
    fields = {**scoring.header(), "form": "compact", "digits": spec.digits, "seed": spec.seed,
              "chance": 10.0 ** -spec.digits, "passkey_fraction": float(config.data.passkey_fraction)}
    results, done = [], []
    for length, batch in batches.items():
        interrupts.check(functools.partial(scoring.interrupted, "passkey", list(done), length))
        size = scoring.rows_per_batch(length, batch_tokens, at_most=len(batch))

        method = f" {scoring.method}" if scoring.method else ""
        with Progress(f"passkey {config.posenc.name}{method} L={length}", math.ceil(len(batch) / size), "batches",
                      shown=scoring.run.writer) as progress:
            def fn(inputs, rows):
                arrays = sharding.global_batch(batch_sharding, inputs.shape,
                                               lambda lo, hi: (inputs[lo:hi], rows[lo:hi]))
                predicted = jax.device_get(predict(scoring.params, *arrays))
                progress.update()
                return predicted

            cells = cell_records(batch, score_examples(fn, batch, size), length, **fields)
        log.info("passkey %s%s L=%d: accuracy %s", config.posenc.name, method, length,
                 ", ".join(f"{r['depth']:g}: {r['accuracy']:.2f}" for r in cells))
        interrupts.check(functools.partial(scoring.interrupted, "passkey", list(done), length))
        results.extend(cells)
        scoring.write("passkey", cells)  # each length kept as it finishes
        done.append(length)
    return results


FORMS = PASSKEY_FORMS
GENERATED = PASSKEY_GENERATED  # the forms whose answers are generated
OPTIONS = (
    Option("passkey_depths", list(PasskeySpec().depths), "where the key sits: 0 = start, 1 = just before the "
           "question", kind=float, domain=unit_interval(), example="--passkey_depths=0,0.5,1", sequence=True),
    Option("passkey_per_cell", PasskeySpec().per_cell, "examples per (length, depth)", domain=at_least(1),
           example="--passkey_per_cell=20"),
    Option("passkey_digits", None, "digits of the key (default: compact the run's data.passkey_digits, else 4; "
           "generated 5)", domain=between(1, 18), example="--passkey_digits=4"),
    Option("passkey_seed", PasskeySpec().seed, "seed of the passkey examples", domain=at_least(0),
           example="--passkey_seed=1234"),
    Option("passkey_form", PasskeySpec().form, "compact (teacher-forced, the models trained here) or generated (an "
           "instruction first, the answer generated with the cache and matched exactly: real models) or chat (the "
           "generated form in the model's chat template)", kind=str,
           choices=FORMS),
    Option("passkey_distances", None, "generated and chat forms: each key this far from the prompt's end, in "
           "tokens or multiples of the model's window, in place of --passkey_depths (never pooled with them)",
           kind=str, example="--passkey_distances=0.5w,1.25w,1.75w", sequence=True))


def _check(target: Target, request: Request) -> PasskeySpec:
    depths, per_cell, digits, seed, form, distances = (request.option(option) for option in OPTIONS)
    spec = PasskeySpec(tuple(depths), per_cell, seed, digits, form, tuple(distances or ()))
    return checked_spec(target.run, target.config, list(target.lengths), spec, target.overrides)


def _recorded(recs: list[dict], header: dict, spec: PasskeySpec) -> dict[int, list[dict]]:
    """{length: its records, one per depth of `spec`} where `recs` hold every depth of `spec` at that
    length from this checkpoint, method and overrides."""
    def place(r):  # a depth, or a designed key's distance (never the one for the other)
        return r.get("distance") if spec.distances else (None if r.get("distance") else float(r["depth"]))
    cells = {(int(r["eval_length"]), place(r)): r for r in recs if same_evaluation(r, header)
             and r.get("digits") == spec.digits and r.get("seed") == spec.seed and r.get("count") == spec.per_cell
             and passkey_form(r) == spec.form}
    places = list(spec.distances) if spec.distances else [float(d) for d in spec.depths]
    lengths = {length for length, _ in cells}
    return {n: [cells[(n, p)] for p in places] for n in sorted(lengths) if all((n, p) in cells for p in places)}


KIND = EvalKind("passkey", "score passkey retrieval (exact match by length and depth) into DIR/eval/passkey.json",
                OPTIONS, _check, lambda scoring, spec, batch_tokens: _evaluate_passkey(scoring, spec, batch_tokens),
                lambda r: (f"passkey{' ' + r['method'] if r.get('method') else ''} L={r['eval_length']:>6}  "
                           f"depth {r['depth']:.2f}  accuracy {r['accuracy']:.2f}"
                           + (f" ({r['form']})" if passkey_form(r) != PASSKEY_FORMS[0] else "")),
                "passkey", recorded=_recorded)
