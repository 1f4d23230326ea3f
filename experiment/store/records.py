"""Every kind of evaluation record, defined once: its file under WORKDIR/eval/, what identifies one
record (evaluations merge by it, sweeps check for it, reports draw series by it), the fields a
record must have, each with its test (`problem`: run directories check a file on reading, so a
damaged one is refused by name instead of failing deep in a report) and how files merge.

Every record carries what produced it (the header, experiment/evals/common.py): `scheme`,
`train_length`, the checkpoint `step`, `data` (dataset), `tokenizer` (the unit), and `overrides`
(eval-time options that took effect) where there are any. Then, per kind:
- perplexity (eval/extrapolation.json): `split` ("books": corpora/books.py's books, `documents` of
  them), `eval_length`, `stride`, `max_tokens` (0 = the whole split; of books: of each book),
  `tokens`, `nll`, `ppl`, `tokens_per_s`, `position_nll`, `band_nll` (the loss by position band
  relative to train_length) and `block_nll` (per block of `block_size` targets; experiment/store/bands.py),
  and `words`, `word_ppl` where the unit is not the word;
- passkey (eval/passkey.json): `task`, `form` (compact: teacher forced, the default where absent;
  generated: an instructed prompt, the answer generated; chat: that prompt in the model's chat template:
  experiment/evals/passkey.py), `eval_length`,
  `depth`, `digits`, `accuracy`, `token_accuracy` (compact), `count`, `seed`, `chance`,
  `passkey_fraction`; generated and chat: `outputs` (each answer's text), `prompt_tokens`, `new_tokens`, `seconds`,
  and for keys placed by distance (--passkey_distances) `placement` "designed", `distance` (as asked) and
  each example's `distances` (tokens from its key sentence to the prompt's end);
- attention (eval/attention.json): `split`, `eval_length`, `windows`, `block`, `layers`, `heads`,
  `positions` (bins of query positions), `mean_distance` and `entropy` (layers x heads x bins).
- ruler (eval/ruler.json): `task`, `eval_length`, `template`, `seed`, `count`, `score` (RULER's: the
  mean over the examples of the fraction of references found), `scores` (each example's), `haystack`,
  `tokens_to_generate`, `prompt_tokens` ([fewest, most]), `seconds`, `answers` (each answer's start),
  `answer_tokens` (each answer's length in tokens; tokens_to_generate: it ran to the budget; optional);
  needles placed by design (optional): `placement` "designed", `needle_distances`, `needle_distance_tokens`,
  `window`, `questions_per_prefill`, and per example `contexts`, `targets`, `distances`; in a book
  haystack `spans` (each example's [first word, words] of the books' `haystack_words`) and, where
  they were drawn apart (--haystack_stretches disjoint), `stretches` "disjoint".
"""
from __future__ import annotations

import dataclasses
import json
from typing import Callable


def curve_options(record: dict) -> str:
    """What sets a record's curve apart besides split, stride and tokens, as JSON: its eval-time
    overrides, or for a training-free method (experiment/evals/methods.py, whose options follow the
    length) {"method": name}: one curve per method, not one per option value."""
    if record.get("method"):
        return json.dumps({"method": record["method"]})
    return json.dumps(record.get("overrides", {}), sort_keys=True)


def series_key(record: dict) -> tuple:
    """The curve a record belongs to: (split, stride kind, max_tokens, curve_options); the stride kind
    is 'nonoverlapping' where stride == eval_length, else the stride. A record that scored fewer
    tokens than its max_tokens scored the whole split (every token of it is scored: `tokens` is its
    length), and is of the whole split's series (max_tokens 0), as evaluations now record it."""
    kind = "nonoverlapping" if record["stride"] == record["eval_length"] else int(record["stride"])
    max_tokens = int(record.get("max_tokens", 0))
    if "tokens" in record and max_tokens > int(record["tokens"]):
        max_tokens = 0
    return (record.get("split", "valid"), kind, max_tokens, curve_options(record))


def record_key(record: dict) -> tuple:
    """One record per (series, eval_length): a newer evaluation replaces the older."""
    return series_key(record) + (int(record["eval_length"]),)


PASSKEY_FORMS = ("compact", "generated", "chat")  # the passkey's forms, in the order reports list them
PASSKEY_GENERATED = ("generated", "chat")         # the forms whose answers are generated


def passkey_form(record: dict) -> str:
    """A passkey record's form: compact where the field is absent (records older than the field)."""
    return record.get("form", PASSKEY_FORMS[0])


def passkey_key(record: dict) -> tuple:
    """One passkey record per (eval_length, depth, digits, overrides, form, distance of a key placed by
    design)."""
    return (int(record["eval_length"]), float(record["depth"]), int(record.get("digits", 4)), curve_options(record),
            passkey_form(record), record.get("distance", ""))


def ruler_key(record: dict) -> tuple:
    """One RULER record per (task, eval_length, template, overrides or method, needle placement: RULER's
    random depths, or the distances and questions per prefill of needles placed by design)."""
    return (record["task"], int(record["eval_length"]), record.get("template", "base"), curve_options(record),
            record.get("placement", "ruler"), tuple(record.get("needle_distances", ())),
            int(record.get("questions_per_prefill", 1)), record.get("stretches", "random"))


def attention_key(record: dict) -> tuple:
    """One attention record per (split, eval_length, overrides)."""
    return (record.get("split"), int(record["eval_length"]), curve_options(record))


def json_type(value) -> str:
    """A parsed JSON value's type as JSON names it ('object', 'list', 'string', ...)."""
    return {dict: "object", list: "list", str: "string", bool: "true/false", type(None): "null"}.get(
        type(value), "number")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _pairs(v, width: int) -> bool:
    """A non-empty list of [int, int(, number)] rows (position bins, per-position losses)."""
    return isinstance(v, list) and bool(v) and all(
        isinstance(row, list) and len(row) == width and _int(row[0]) and _int(row[1])
        and all(_number(x) for x in row[2:]) for row in v)


# (test, what the value must be) of the fields reports and merges read
POSITIVE = (lambda v: _int(v) and v >= 1, "a positive integer")
COUNT = (lambda v: _int(v) and v >= 0, "an integer >= 0")
PPL = (lambda v: _number(v) and not v <= 0, "a number > 0")  # inf / NaN: a diverged model, drawn as a gap
SHARE = (lambda v: _number(v) and 0 <= v <= 1, "a number from 0 to 1")
NUMBER = (_number, "a number")
TEXT = (lambda v: isinstance(v, str), "a string")
OPTIONS = (lambda v: isinstance(v, dict), "an object of option: value")
BINS = (lambda v: _pairs(v, 2), "a list of [first, last] position bins")
POSITION_NLL = (lambda v: _pairs(v, 3), "a list of [first, last, loss] rows")
BAND_NLL = (lambda v: _pairs(v, 4), "a list of [first, last, tokens, loss] rows")
BLOCK_NLL = (lambda v: _pairs(v, 3), "a list of [first position, tokens, loss] rows")
SHARES = (lambda v: isinstance(v, list) and all(_number(x) and 0 <= x <= 1 for x in v), "a list of numbers from 0 to 1")
HEADER = {"step": COUNT, "train_length": POSITIVE, "scheme": TEXT, "tokenizer": TEXT, "overrides": OPTIONS,
          "method": TEXT, "same_as": TEXT}  # method: experiment/evals/methods.py; same_as: the record it repeats


def _attention_shapes(record: dict) -> str | None:
    """mean_distance and entropy: layers x heads x position bins of numbers."""
    shape = (record["layers"], record["heads"], len(record["positions"]))
    for name in ("mean_distance", "entropy"):
        value = record[name]
        for depth, size in enumerate(shape):
            rows = [value]
            for _ in range(depth):
                rows = [x for row in rows for x in row]
            if not all(isinstance(row, list) and len(row) == size for row in rows):
                return f"{name} is not layers x heads x position bins = {' x '.join(map(str, shape))}"
        if not all(_number(x) for layer in value for head in layer for x in head):
            return f"{name} holds a value that is not a number"
    return None


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of evaluation record: its file under WORKDIR/eval/, the key a newer record replaces by,
    the fields every record must have and those it may have (each with its test), a check of the
    record as a whole, and the eval_extrapolate.py flag that writes it."""
    name: str
    file: str
    key: Callable[[dict], tuple]
    required: dict
    optional: dict
    whole: Callable[[dict], str | None] = lambda record: None
    flag: str = ""


KINDS = {kind.name: kind for kind in (
    Kind("perplexity", "extrapolation.json", record_key,
         {"eval_length": POSITIVE, "stride": POSITIVE, "tokens": COUNT, "ppl": PPL},
         {**HEADER, "split": TEXT, "max_tokens": COUNT, "nll": NUMBER, "words": COUNT, "word_ppl": PPL,
          "position_nll": POSITION_NLL, "band_nll": BAND_NLL, "block_nll": BLOCK_NLL, "block_size": POSITIVE,
          "documents": POSITIVE}),
    Kind("passkey", "passkey.json", passkey_key,
         {"eval_length": POSITIVE, "depth": SHARE, "accuracy": SHARE, "count": POSITIVE},
         {**HEADER, "digits": POSITIVE, "token_accuracy": SHARE, "chance": SHARE, "passkey_fraction": SHARE,
          "form": (lambda v: v in PASSKEY_FORMS, "one of " + ", ".join(PASSKEY_FORMS)),
          "prompt_tokens": POSITIVE,
          "new_tokens": POSITIVE, "seconds": NUMBER,
          "outputs": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
          "placement": (lambda v: v in ("ruler", "designed"), "ruler or designed"), "distance": TEXT,
          "distances": (lambda v: isinstance(v, list) and all(_int(x) and x >= 0 for x in v), "a list of counts")},
         flag="--passkey"),
    Kind("attention", "attention.json", attention_key,
         {"eval_length": POSITIVE, "layers": POSITIVE, "heads": POSITIVE, "positions": BINS,
          "mean_distance": (lambda v: isinstance(v, list), "a list"), "entropy": (lambda v: isinstance(v, list), "a list")},
         {**HEADER, "split": TEXT, "windows": POSITIVE, "block": POSITIVE}, _attention_shapes, "--attention"),
    Kind("ruler", "ruler.json", ruler_key,
         {"task": TEXT, "eval_length": POSITIVE, "score": SHARE, "count": POSITIVE},
         {**HEADER, "template": TEXT, "seed": COUNT, "scores": SHARES, "haystack": TEXT, "tokens_to_generate": POSITIVE,
          "prompt_tokens": (lambda v: isinstance(v, list) and len(v) == 2 and all(_int(x) for x in v),
                            "[fewest, most] prompt tokens"),
          "seconds": NUMBER, "answers": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                                         "a list of strings"),
          "answer_tokens": (lambda v: isinstance(v, list) and all(_int(x) and x >= 0 for x in v),
                            "a list of token counts"),
          "placement": (lambda v: v in ("ruler", "designed"), "ruler or designed"),
          "questions_per_prefill": POSITIVE,
          **{k: (lambda v: isinstance(v, list) and all(_int(x) and x >= 0 for x in v), "a list of counts")
             for k in ("targets", "distances", "contexts")},
          "spans": (lambda v: _pairs(v, 2) and all(row[0] >= 0 and row[1] >= 1 for row in v),
                    "a list of [first word, words] stretches"),
          "haystack_words": POSITIVE,
          "stretches": (lambda v: v in ("random", "disjoint"), "random or disjoint")},
         lambda r: next((f"{k} holds {len(r[k])} values for a count of {r['count']}"
                         for k in ("scores", "answer_tokens", "targets", "distances", "contexts", "spans")
                         if k in r and len(r[k]) != r["count"]), None), "--ruler"))}


def record_kind(name: str) -> Kind:
    if name not in KINDS:
        raise ValueError(f"unknown record kind {name!r}; valid: {', '.join(KINDS)}")
    return KINDS[name]


def problem(kind: str, data) -> str | None:
    """What makes `data` (a records file's parsed JSON) not a list of records of `kind`; None if
    nothing does. Reports and merges read these fields without checking them again."""
    spec = record_kind(kind)
    if not isinstance(data, list):
        return f"it holds a JSON {json_type(data)}, not a list of records"
    for i, record in enumerate(data):
        if not isinstance(record, dict):
            return f"record {i} is a JSON {json_type(record)}, not an object"
        for name, (test, what) in {**spec.required, **spec.optional}.items():
            if name not in record:
                if name in spec.required:
                    return f"record {i} has no {name!r}"
            elif not test(record[name]):
                shown = repr(record[name])
                return f"record {i}: {name} = {shown if len(shown) < 60 else shown[:57] + '...'} is not {what}"
        whole = spec.whole(record)
        if whole:
            return f"record {i}: {whole}"
    return None


def series_label(key: tuple) -> str:
    """'nonoverlapping', 'stride 64, first 32,768 tokens, yarn_scale=4', ... (the split is shown apart)."""
    _, kind, max_tokens, overrides = key
    label = "nonoverlapping" if kind == "nonoverlapping" else f"stride {kind}"
    if max_tokens:
        label += f", first {max_tokens:,} tokens"
    for name, value in sorted(json.loads(overrides).items()):
        label += f", {value}" if name == "method" else f", {name.split('.')[-1]}={value}"
    return label


def tensorboard_tag(record: dict) -> str:
    """'eval/valid/ppl_L256', with '_S64', '_first32768', '_yarn_scale=4' where they apply."""
    _, kind, max_tokens, overrides = series_key(record)
    tag = f"eval/{record.get('split', 'valid')}/ppl_L{record['eval_length']}"
    tag += "" if kind == "nonoverlapping" else f"_S{kind}"
    tag += f"_first{max_tokens}" if max_tokens else ""
    return tag + "".join(f"_{k.split('.')[-1]}={v}" for k, v in sorted(json.loads(overrides).items()))


def merge(old: list[dict], new: list[dict], key=record_key) -> tuple[list[dict], list[dict]]:
    """(merged records, dropped stale records). A new record replaces the one with its `key`;
    records from a checkpoint older than the newest one merged are dropped (stale: the run trained
    on since), so every record kept comes from one checkpoint. Every kind of record (perplexity,
    passkey, attention) merges here, each with its own key."""
    merged = {key(r): r for r in old}
    merged.update({key(r): r for r in new})
    newest = max((int(r.get("step", 0)) for r in new), default=None)
    kept, stale = [], []
    for r in merged.values():
        (stale if newest is not None and int(r.get("step", 0)) < newest else kept).append(r)
    kept.sort(key=lambda r: tuple(str(x) for x in key(r)))
    return kept, stale
