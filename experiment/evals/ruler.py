"""RULER (corpora/ruler/: its synthetic tasks built to each length in the model's tokens) scored on
a run's newest checkpoint: answers generated greedily with the key / value cache (models/generate.py)
under the run's eval-time options or training-free method, within RULER's answer budget per task,
and scored as RULER scores them (the fraction of the reference strings found in the answer).

    eval_extrapolate.py --workdir W --ruler --ruler_tasks niah_single_1,vt --samples 20 --lengths 4096,8192

The prompt is RULER's `base` template (the task's text, then its answer prefix) or, with
--ruler_template chat, the model's own chat template (the run's chat_template.jinja) with the answer
prefix after the assistant's turn begins; the record says which. Example i of a (task, length, seed)
is the same for every method, so methods are compared on the same prompts.

Needles by design (corpora/ruler/designed.py): with --needle_distances (tokens from the prompt's end,
or multiples of the model's window, config.train.seq_len: `--needle_distances 0.5w,1.25w,1.75w`) each
asked needle of a needle task sits at one of those distances, every distance asked equally often, in
place of RULER's random depths; with --questions_per_prefill k a context holds k needles of distinct
keys and each is asked in a question of its own: the context is prefilled once and each question read
and answered from a copy of its cache (models/generate.py `generate_shared`; the same answers as k
prompts). --samples counts questions (a multiple of k). The records say `placement` ("designed";
RULER's: "ruler" or absent), the distances asked, each question's `targets`, measured `distances` and
`contexts` (its context's index: questions of one context are one cluster, experiment/report/pairs.py),
and, in a book haystack, `spans` (each question's stretch of the books: [first word, words] of their
`haystack_words`; prompts whose stretches share text are tested as one group); the two placements are
never taken for the same cell. A designed book cell recorded without `spans` gets them the next time it
is found done (--skip_done): its prompts built again and checked against the record's distances.

Records (kind `ruler`, WORKDIR/eval/ruler.json; experiment/store/records.py): one per (task,
eval_length, template, overrides or method), written as each finishes: its mean `score`, each
example's (`scores`), `count`, the prompts' token counts, the start of each answer and its length in
tokens (`answer_tokens`; older records lack it). With
--skip_done a (task, length) already recorded with the same settings is not scored again. A cell's
answers are kept batch by batch (experiment/evals/partial.py): an interrupted cell goes on from them.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time

from corpora import ruler as task_lib
from experiment.evals.common import Scoring
from experiment.evals.kinds import EvalKind, Option, Request, Target, same_evaluation
from experiment.evals.partial import Partial
from experiment.evals.spread import Spread
from experiment.runtime import interrupts
from experiment.runtime.progress import Progress
from corpora.ruler import designed
from models.generate import generate, generate_shared
from models.generation.chat import TEMPLATE_FILE
from models.generation.text import Text
from posenc.domains import at_least

log = logging.getLogger(__name__)

PREVIEW_CHARS = 160  # the start of each answer kept in the record (what the model said, to read)
TEMPLATES = ("base", "chat")


@dataclasses.dataclass(frozen=True)
class RulerSpec:
    """What to ask: the tasks, examples per (task, length), the examples' seed, the template and
    whether cells already recorded with these settings are skipped (the command's --skip_done)."""
    tasks: tuple[str, ...] = task_lib.DEFAULT
    samples: int = 20
    seed: int = 42
    template: str = "base"
    skip_done: bool = False
    distances: tuple[str, ...] = ()  # needles by design: tokens from the end, or multiples of the window ('1.25w')
    questions: int = 1               # needles asked per context, one prefill for them all
    stretches: str = "random"        # a designed book cell's stretches: at random, or "disjoint" slots

    @property
    def placement(self) -> str:
        return "designed" if self.distances else "ruler"


def distance_tokens(text: str, window: int, flag: str = "--needle_distances") -> int:
    """A needle distance in tokens: '12000', or a multiple of the model's window ('1.25w')."""
    item = str(text).strip().lower()
    try:
        value = float(item[:-1]) * window if item.endswith("w") else float(item)
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is neither a number of tokens (12000) nor a multiple of the "
                         f"model's window (1.25w)") from None
    if value <= 0:
        raise ValueError(f"{flag}: {text!r} must be above 0")
    return int(round(value))


def targets_of(spec: RulerSpec, window: int) -> list[int]:
    return [distance_tokens(d, window) for d in spec.distances]


def prompter(text: Text, template: str) -> task_lib.Prompter:
    """RULER's prompt in `text`'s tokens: `base` (plain text with the tokenizer's own special tokens)
    or `chat` (the chat template's text, which holds its own)."""
    return task_lib.Prompter(text.encode, text.chat if text.chat_template else None, template)


def text_of(run, tokenizer, template: str) -> Text:
    """The run's text side; its chat template (chat_template.jinja) where `template` is chat."""
    path = run.path / TEMPLATE_FILE
    return Text(tokenizer, path.read_text() if template == "chat" and path.is_file() else None)


def cell_record(task: task_lib.Task, length: int, spec: RulerSpec, built: list[task_lib.Built],
                answers: list[str], seconds: float, header: dict, answer_tokens: list[int] | None = None,
                design: dict | None = None, earlier: dict | None = None) -> dict:
    """The record of one (task, length): RULER's score of each answer, their mean and what was asked;
    `answer_tokens`: each answer's length in tokens, its end of text not counted (tokens_to_generate:
    it ran to RULER's budget); `design`: the fields of needles placed by design (`_design`); `earlier`:
    the record this cell extends (`_earlier`), whose scores its first questions keep (its answers
    are kept only in part: scored again, a long answer could lose its needle)."""
    kept = earlier["scores"] if earlier else []
    scores = kept + [task_lib.score(answer, b.example.references)
                     for answer, b in zip(answers[len(kept):], built[len(kept):])]
    tokens = [len(b.ids) for b in built]
    return {**header, **(design or {}), "task": task.name, "eval_length": int(length), "template": spec.template,
            "seed": spec.seed,
            "count": len(scores), "score": sum(scores) / len(scores), "scores": scores,
            "haystack": task.haystack, "tokens_to_generate": task.tokens_to_generate,
            "prompt_tokens": [min(tokens), max(tokens)], "seconds": round(seconds, 1),
            "answers": [a.strip()[:PREVIEW_CHARS] for a in answers],
            **({"answer_tokens": [int(n) for n in answer_tokens]} if answer_tokens is not None else {}),
            **({"extended_from": len(kept)} if earlier else {})}


def _earlier(scoring: Scoring, spec: RulerSpec, name: str, length: int, design: dict) -> dict | None:
    """A record of this designed cell with fewer questions, the most, whose prompts are this cell's first
    ones (context j is the same whatever else is asked: corpora/ruler/designed.py; checked by each
    question's context, target and measured distance): its questions are not asked again."""
    if not design:
        return None
    header, found = scoring.header(), None
    for r in scoring.run.records("ruler"):
        n = int(r.get("count", 0))
        if (r.get("task") == name and int(r.get("eval_length", -1)) == length and 0 < n < spec.samples
                and same_evaluation(r, header) and _same_settings({**r, "count": spec.samples}, spec)
                and "answer_tokens" in r and all(r.get(k) == design[k][:n] for k in ("contexts", "targets", "distances"))
                and (found is None or n > found["count"])):
            found = r
    return found


def _done(scoring: Scoring, spec: RulerSpec) -> set[tuple[str, int]]:
    """(task, length) cells this checkpoint, method and overrides already hold with `spec`'s settings."""
    header = scoring.header()
    return {(r["task"], int(r["eval_length"])) for r in scoring.run.records("ruler")
            if same_evaluation(r, header) and _same_settings(r, spec)}


def _same_settings(record: dict, spec: RulerSpec) -> bool:
    return (record.get("template") == spec.template and record.get("seed") == spec.seed
            and record.get("count") == spec.samples and record.get("placement", "ruler") == spec.placement
            and list(record.get("needle_distances", [])) == list(spec.distances)
            and int(record.get("questions_per_prefill", 1)) == spec.questions
            and record.get("stretches", "random") == spec.stretches)


def _design(spec: RulerSpec, window: int, contexts) -> dict:
    """A designed cell's record fields: what was asked, and each question's context and distances."""
    return {"placement": "designed", "needle_distances": list(spec.distances), "window": int(window),
            "needle_distance_tokens": targets_of(spec, window), "questions_per_prefill": spec.questions,
            "contexts": [j for j, c in enumerate(contexts) for _ in c.examples],
            "targets": [int(d) for c in contexts for d in c.targets],
            "distances": [int(d) for c in contexts for d in c.distances],
            **({"stretches": spec.stretches} if spec.stretches != "random" else {}), **_spans(contexts)}


def _spans(contexts) -> dict:
    """A book haystack's stretch per question ([first word, words] of the books' `haystack_words`):
    prompts whose stretches share text are tested together (experiment/report/pairs.py)."""
    if not contexts or contexts[0].span is None:
        return {}
    return {"spans": [[int(c.span[0]), int(c.span[1])] for c in contexts for _ in c.examples],
            "haystack_words": int(contexts[0].haystack_words)}


def _build(name: str, length: int, spec: RulerSpec, prompts, window: int, contexts: int | None = None):
    """(the prompts of a cell, its contexts where placed by design, else None)."""
    if not spec.distances:
        return task_lib.build(name, length, spec.samples, spec.seed, prompts), None
    made = designed.build(name, length, contexts or spec.samples // spec.questions, spec.seed, prompts,
                          targets_of(spec, window), spec.questions, disjoint=spec.stretches == "disjoint")
    return [b for c in made for b in c.examples], made


def _answers(model, source: Text, built: list[task_lib.Built], max_new: int, rows: int, progress, partial: Partial,
             start: float, stopped, shared: int = 1) -> tuple[list[str], list[int]]:
    """The greedy answer of each prompt and its length in tokens, `rows` prompts a batch, each at most
    `max_new` tokens; each batch kept in `partial` as it comes, and the answers it already holds not
    generated again. `shared` > 1: the prompts come in groups of that many questions about one context,
    each group a batch whose context is prefilled once (`generate_shared`). The batches are spread over
    every device and process of the job (experiment/evals/spread.py)."""
    if partial.answers:
        progress.update(len(partial.answers))
    rows = shared if shared > 1 else rows
    ask = generate_shared if shared > 1 else generate
    batches = [[b.ids for b in built[lo:lo + rows]] for lo in range(len(partial.answers), len(built), rows)]
    spread = Spread(model, lambda m, batch: ask(m, batch, max_new, stop=source.stop_ids or None), max_new)
    interrupts.check(stopped)
    for batch, new in zip(batches, spread.answers(batches)):
        partial.add([[source.decode(ids), len(ids)] for ids in new], time.perf_counter() - start)
        progress.update(len(batch))
        interrupts.check(stopped)
    return [text for text, _ in partial.answers], [int(n) for _, n in partial.answers]


def _evaluate_ruler(scoring: Scoring, spec: RulerSpec, batch_tokens: int) -> list[dict]:
    source = text_of(scoring.run, scoring.tokenizer, spec.template)
    prompts = prompter(source, spec.template)
    model = scoring.model()
    model.compile_calls = True
    done = _done(scoring, spec) if spec.skip_done else set()
    method = f" {scoring.method}" if scoring.method else ""
    window = int(scoring.config.train.seq_len)
    results, finished = [], []
    for length in scoring.lengths:
        for name in spec.tasks:
            if (name, int(length)) in done:
                _add_spans(scoring, spec, name, int(length), prompts, window)
                continue
            interrupts.check(functools.partial(scoring.interrupted, "ruler", list(finished), length))
            task = task_lib.task(name)
            start = time.perf_counter()
            built, contexts = _build(name, length, spec, prompts, window)
            design = _design(spec, window, contexts) if contexts is not None else {}
            rows = max(1, min(spec.samples, batch_tokens // length))
            partial = Partial.open(scoring.run, "ruler", {**scoring.header(), "task": name, "eval_length": int(length),
                                                          "template": spec.template, "seed": spec.seed,
                                                          "tokens_to_generate": task.tokens_to_generate,
                                                          **{k: design[k] for k in ("placement", "needle_distances",
                                                                                    "questions_per_prefill", "stretches")
                                                             if k in design}},
                                   [b.ids for b in built])
            earlier = _earlier(scoring, spec, name, int(length), design)
            if earlier and len(partial.answers) < earlier["count"]:  # its answers stand for the first questions
                log.info("ruler %s%s L=%d: the %d questions of the record kept, %d more asked", name, method, length,
                         earlier["count"], len(built) - earlier["count"])
                partial.answers = [[a, n] for a, n in zip(earlier["answers"], earlier["answer_tokens"])]
                partial.seconds = float(earlier["seconds"])
            stopped = functools.partial(_stopped, scoring, list(finished), length, name, partial, len(built))
            with Progress(f"ruler {name}{method} L={length}", spec.samples, "prompts",
                          shown=scoring.run.writer) as progress:
                answers, answer_tokens = _answers(model, source, built, task.tokens_to_generate, rows, progress,
                                                  partial, start, stopped, spec.questions)
            record = cell_record(task, length, spec, built, answers,
                                 partial.total_seconds(time.perf_counter() - start), scoring.header(), answer_tokens,
                                 design, earlier)
            log.info("ruler %s%s L=%d: %.3f over %d examples (%.0f s)", name, method, length, record["score"],
                     record["count"], record["seconds"])
            scoring.write("ruler", [record])  # each cell kept as it finishes
            partial.close()
            results.append(record)
        finished.append(length)
    return results


_REBUILT: dict[tuple, list] = {}  # the last cell's contexts built again for `_add_spans`


def _lacks_spans(record: dict, spec: RulerSpec) -> bool:
    """A designed book cell recorded before records kept each prompt's stretch: it is evaluated again,
    and `_add_spans` gives it them (nothing is asked of the model)."""
    return bool(spec.distances) and "spans" not in record and task_lib.task(record["task"]).book


def _add_spans(scoring: Scoring, spec: RulerSpec, name: str, length: int, prompts, window: int) -> None:
    """A designed book cell recorded before records kept each prompt's stretch (`spans`) gets them here:
    its prompts built again (nothing asked of the model) and checked against the record's contexts,
    targets and measured distances, so that the stretches are those of the prompts that were scored."""
    header = scoring.header()
    for r in scoring.run.records("ruler"):
        if (r["task"] != name or int(r["eval_length"]) != length or not _lacks_spans(r, spec)
                or not same_evaluation(r, header) or not _same_settings(r, spec)):
            continue
        key = (str(scoring.run.path), name, length, window, dataclasses.replace(spec, skip_done=False))
        if key not in _REBUILT:  # one build serves every method of the command (the prompts are the same)
            _REBUILT.clear()
            _REBUILT[key] = _build(name, length, spec, prompts, window)[1]
        contexts = _REBUILT[key]
        design = _design(spec, window, contexts)
        if any(r.get(k) != design[k] for k in ("contexts", "targets", "distances")):
            log.warning("ruler %s L=%d: the prompts built now are not the record's (measured distances differ); "
                        "its book stretches are not added", name, length)
            return
        scoring.write("ruler", [{**r, **_spans(contexts)}])
        log.info("ruler %s L=%d: the record's %d prompts built again; each one's book stretch added (`spans`)",
                 name, length, len(design["spans"]))
        return


def _stopped(scoring: Scoring, finished: list[int], length: int, name: str, partial: Partial, total: int) -> str:
    """What a Ctrl-C within a cell leaves: the records of the lengths done and the cell's kept answers."""
    return f"{scoring.interrupted('ruler', finished, length)} ({name}: {partial.kept(total)})"


OPTIONS = (
    Option("ruler_tasks", list(task_lib.DEFAULT), "RULER tasks to score (corpora/ruler/tasks.py)", kind=str,
           example="--ruler_tasks=niah_single_1,vt", sequence=True, choices=tuple(task_lib.TASKS)),
    Option("samples", RulerSpec().samples, "ruler: examples per (task, length)", domain=at_least(1),
           example="--samples=20", sequence=False),
    Option("ruler_template", RulerSpec().template, "ruler: RULER's base template, or the model's chat template",
           kind=str, choices=TEMPLATES),
    Option("ruler_seed", RulerSpec().seed, "ruler: seed of the examples", domain=at_least(0),
           example="--ruler_seed=42", sequence=False),
    Option("needle_distances", [], "ruler: each asked needle at one of these distances from the prompt's end, in "
           "tokens or multiples of the model's window, in place of RULER's random depths (needle tasks asking one "
           "value: " + ", ".join(designed.DESIGNED_TASKS) + ")", kind=str, example="--needle_distances=0.5w,1.25w,1.75w",
           sequence=True),
    Option("questions_per_prefill", RulerSpec().questions, "ruler, with --needle_distances: needles asked about one "
           "context, prefilled once (--samples counts questions, a multiple of it)", domain=at_least(1),
           example="--questions_per_prefill=4", sequence=False),
    Option("haystack_stretches", RulerSpec().stretches, "ruler, with --needle_distances and a book haystack: each "
           "context's stretch of the books from a random sentence (contexts can share text; the report tests those "
           "that do as one group) or from slots of the books that share no text (disjoint; as many contexts as the "
           "books hold, those past that at random)", kind=str, choices=("random", "disjoint")))


def checked_spec(target: Target, spec: RulerSpec) -> RulerSpec:
    """`spec` checked before any checkpoint is read: known tasks, samples >= 1, a chat template where
    one is asked for, and every task buildable at the shortest length (its fixed text fits)."""
    tasks = tuple(dict.fromkeys(spec.tasks))
    for name in tasks:
        task_lib.task(name)
    if not tasks or spec.samples < 1 or spec.template not in TEMPLATES:
        raise ValueError(f"ruler needs tasks, samples >= 1 and a template of {', '.join(TEMPLATES)}; got tasks "
                         f"{list(tasks)}, samples {spec.samples}, template {spec.template!r}")
    window = int(target.config.train.seq_len)
    if spec.stretches != "random" and not (spec.distances and any(task_lib.task(t).book for t in tasks)):
        raise ValueError(f"--haystack_stretches={spec.stretches} draws a designed cell's book stretches apart: give "
                         f"--needle_distances and a book-haystack task (niah_single_2, niah_multikey_1)")
    if spec.questions > 1 and not spec.distances:
        raise ValueError(f"--questions_per_prefill={spec.questions} places its needles by design: give "
                         f"--needle_distances (as many distances as questions, or more)")
    if spec.distances:
        targets_of(spec, window)
        refused = [t for t in tasks if not designed.supports(t)]
        if refused:
            raise ValueError(f"--needle_distances: {', '.join(refused)} cannot place needles by distance; use "
                             f"--ruler_tasks from {', '.join(designed.DESIGNED_TASKS)}")
        if spec.samples % spec.questions:
            raise ValueError(f"--samples={spec.samples} counts questions: make it a multiple of "
                             f"--questions_per_prefill={spec.questions}")
    run = target.run
    if spec.template == "chat" and not (run.path / TEMPLATE_FILE).is_file():
        raise ValueError(f"--ruler_template chat: {run.path} has no {TEMPLATE_FILE}; put the checkpoint's chat "
                         f"template there, or drop --ruler_template")
    _buildable(run, target.config, tasks, min(target.lengths), spec)
    return dataclasses.replace(spec, tasks=tasks)


_BUILT: set[tuple] = set()  # the checks already passed in this process (one per method otherwise)


def _buildable(run, config, tasks: tuple[str, ...], length: int, spec: RulerSpec) -> None:
    """Build example 0 (context 0) of each task at `length` (a RulerError where its fixed text does
    not fit, or a designed distance does not)."""
    key = (str(run.path), tasks, length, spec.seed, spec.template, spec.distances, spec.questions, spec.stretches)
    if key in _BUILT:
        return
    prompts = prompter(text_of(run, run.tokenizer(config.data, write=False), spec.template), spec.template)
    one = dataclasses.replace(spec, samples=spec.questions)
    for name in tasks:
        _build(name, length, one, prompts, int(config.train.seq_len), contexts=1)
    _BUILT.add(key)


def _check(target: Target, request: Request) -> RulerSpec:
    tasks, samples, template, seed, distances, questions, stretches = (request.option(option) for option in OPTIONS)
    spec = RulerSpec(tuple(tasks), int(samples), int(seed), str(template), request.skip_done,
                     tuple(str(d) for d in distances or ()), int(questions), str(stretches))
    return checked_spec(target, spec)


def _recorded(recs: list[dict], header: dict, spec: RulerSpec) -> dict[int, list[dict]]:
    """{length: its records, one per task of `spec`} where `recs` hold every task at that length from
    this checkpoint, method and overrides with `spec`'s template, seed and sample count."""
    cells = {(int(r["eval_length"]), r["task"]): r for r in recs if same_evaluation(r, header) and _same_settings(r, spec)
             and not _lacks_spans(r, spec)}
    lengths = {length for length, _ in cells}
    return {n: [cells[(n, t)] for t in spec.tasks] for n in sorted(lengths) if all((n, t) in cells for t in spec.tasks)}


KIND = EvalKind("ruler", "score RULER's synthetic tasks (generated answers, RULER's score) into DIR/eval/ruler.json",
                OPTIONS, _check, _evaluate_ruler,
                lambda r: (f"ruler{' ' + r['method'] if r.get('method') else ''} L={r['eval_length']:>6}  "
                           f"{r['task']:<16} score {r['score']:.2f} ({r['count']} examples"
                           + (f"; needles at {','.join(r['needle_distances'])}, {r['questions_per_prefill']} a prefill"
                              if r.get("placement") == "designed" else "") + ")"),
                "ruler", recorded=_recorded)
