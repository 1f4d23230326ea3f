"""Perplexity at many evaluation lengths (the protocol of Press et al. 2022, see corpora.batching).

The windows of a batch are split over every device of the job; each length compiles one program
(the last batch is padded to the same shape), and the entry points cache compiled programs on disk
(experiment/runtime/accelerator.py), so evaluating the same shapes again compiles nothing.

`--documents books` scores the four books of corpora/books.py in place of the run's split (each book
its own document: no window crosses two; `max_tokens` then takes the first N tokens of each book),
recorded with split "books". Every record holds its loss by position band (before the training
length L, L-2L, 2L-4L, ...) and by block of 512 targets (experiment/store/bands.py), which pair
evaluations of the same tokens for the report's bootstrap (experiment/report/bootstrap.py).

Records (kind `perplexity`, WORKDIR/eval/extrapolation.json; experiment/store/records.py) are merged
with what the file already holds, each length as it finishes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import pathlib
import time

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import corpora
from corpora import books as books_lib
from corpora.documents import document_batches, document_windows
from experiment.evals.common import EvalSpec, Scoring, binned, eval_spec, window_positions
from experiment.evals.kinds import EvalKind, Option, Request, SPLIT, Target, evaluate_kinds, same_evaluation
from experiment.runtime import interrupts, sharding
from experiment.runtime.progress import Progress
from experiment.store import bands, records
from experiment.store.run import RunDir
from experiment.store.tensorboard import EventWriter
from posenc.domains import at_least

log = logging.getLogger(__name__)


def evaluate(workdir: str | pathlib.Path | RunDir, lengths: list[int] | None = None, stride: int | None = None,
             split: str | None = None, batch_tokens: int | None = None, *,
             skip_impossible: bool = False, max_tokens: int | None = None,
             overrides: dict[str, str] | None = None) -> list[dict]:
    """Evaluate the run's newest checkpoint at each length; every argument left None comes from the
    run's config.eval (`eval_spec`). stride 0 = nonoverlapping.

    `max_tokens` > 0 scores only the first max_tokens tokens of the split (quick looks and
    CPU-sized sliding windows; the record says so), 0 the whole split; a max_tokens the split does
    not exceed scores the whole split, and is recorded as such (0), with a warning.
    `overrides` ({"posenc.rope.yarn_scale": "4"}) switch eval-time knobs on without retraining;
    the records carry them. An override for a scheme the run does not use is refused.

    A length the scheme cannot encode raises its LengthError, or is skipped with a warning when
    `skip_impossible` (sweeps that include a learned table). One kind of evaluate_kinds."""
    request = Request(lengths, overrides, batch_tokens, skip_impossible,
                      {"stride": stride, "split": split, "max_tokens": max_tokens})
    return evaluate_kinds(workdir, ("perplexity",), request)["perplexity"]


def _documents(scoring: Scoring, spec: EvalSpec) -> tuple[list[np.ndarray], int, EvalSpec]:
    """(the token streams scored, one per document, each cut to max_tokens; their word count; `spec`):
    the run's split as one document, or the books (`--documents books`). A max_tokens that the split
    does not exceed scores the whole split, and `spec` then says so (max_tokens 0), with a warning."""
    run, config, tokenizer = scoring.run, scoring.config, scoring.tokenizer
    if spec.split in DOCUMENT_SETS:
        docs = [tokenizer.encode_lines(book.text.rstrip("\n").split("\n")) for book in books_lib.books()]
        docs = [d[:spec.max_tokens] if spec.max_tokens else d for d in docs]
        return docs, sum(corpora.count_words_in_text(tokenizer.decode(d)) for d in docs), spec
    with interrupts.immediate(f"interrupted while reading the {spec.split} split; no record was written: the "
                              f"same command evaluates again"):
        stream, words = run.stream(config.data, spec.split, tokenizer, write=run.writer)
    if spec.max_tokens and spec.max_tokens < len(stream):
        stream = stream[:spec.max_tokens]
        words = corpora.count_words_in_text(tokenizer.decode(stream))
    elif spec.max_tokens:  # a record holds what was scored: the whole split, the series of max_tokens 0
        log.warning("max_tokens %s: the %s split has %s tokens, so all of it is scored and recorded as the whole "
                    "split", f"{spec.max_tokens:,}", spec.split, f"{len(stream):,}")
        spec = dataclasses.replace(spec, max_tokens=0)
    return [stream], words, spec


def _evaluate(scoring: Scoring, spec: EvalSpec, batch_tokens: int) -> list[dict]:
    run, config = scoring.run, scoring.config
    docs, words, spec = _documents(scoring, spec)
    graphdef = scoring.graphdef

    @functools.partial(jax.jit, out_shardings=NamedSharding(scoring.mesh, P()))  # on every device
    def score(params, inputs, targets, weights, windows):
        model = nnx.merge(graphdef, params)
        positions = window_positions(model.scheme, config, windows, inputs.shape[1])
        return model.token_nll(inputs, targets, positions) * weights

    results = []
    with EventWriter(run.tensorboard_dir) if run.writer else contextlib.nullcontext() as board:
        for length in scoring.lengths:
            stop = functools.partial(scoring.interrupted, "perplexity", [r["eval_length"] for r in results], length)
            record = _score_length(scoring, spec, length, (docs, words), score, batch_tokens, stop)
            results.append(record)
            scoring.write("perplexity", [record])  # each length kept as it finishes
            if board is not None:
                board.scalar(records.tensorboard_tag(record), record["ppl"], record["step"])
    return results


def _score_length(scoring: Scoring, spec: EvalSpec, length: int, text: tuple, score, batch_tokens: int,
                  stop) -> dict:
    """One evaluation length's record. `text`: (the documents' token streams, their word count);
    `stop()`: what a Ctrl-C between two batches leaves (experiment/runtime/interrupts.py)."""
    docs, words = text
    config, tokenizer = scoring.config, scoring.tokenizer
    batch_sharding = sharding.batch_sharding(scoring.mesh)
    s = spec.stride or length
    batch = scoring.rows_per_batch(length, batch_tokens)
    windows = len(document_windows([len(d) for d in docs], length, s)[0])
    blocks = bands.Blocks([len(d) for d in docs])
    pos_nll, pos_count = np.zeros(length), np.zeros(length)
    t0 = time.perf_counter()
    method = f" {scoring.method}" if scoring.method else ""
    with Progress(f"eval {config.posenc.name}{method} L={length} S={s}", math.ceil(windows / batch), "batches",
                  shown=scoring.run.writer) as progress:
        for index, (inputs, targets, weights, target_ids) in enumerate(
                document_batches(docs, length, s, batch, tokenizer.eos_id)):
            interrupts.check(stop)
            window_ids = np.arange(index * batch, (index + 1) * batch, dtype=np.int32)
            arrays = sharding.global_batch(
                batch_sharding, inputs.shape,
                lambda lo, hi: (inputs[lo:hi], targets[lo:hi], weights[lo:hi], window_ids[lo:hi]))
            nll = np.asarray(jax.device_get(score(scoring.params, *arrays)), dtype=np.float64)
            pos_nll += nll.sum(axis=0)
            pos_count += weights.sum(axis=0)
            blocks.add(target_ids, nll)
            progress.update()
    interrupts.check(stop)  # pressed during the last batch: its record is not written
    elapsed = time.perf_counter() - t0
    total, count = float(pos_nll.sum()), float(pos_count.sum())
    nll = total / count
    train_length = int(config.train.seq_len)
    record = {**scoring.header(), "eval_length": length, "stride": s, "split": spec.split, "tokens": int(count),
              "nll": nll, "ppl": math.exp(nll), "tokens_per_s": count / elapsed,
              "max_tokens": int(spec.max_tokens), "position_nll": binned(pos_nll, pos_count),
              "band_nll": bands.bands(pos_nll, pos_count, train_length)}
    block_rows = blocks.rows()
    if block_rows:
        record.update(block_size=bands.BLOCK, block_nll=block_rows)
    if spec.split in DOCUMENT_SETS:
        record["documents"] = sum(1 for d in docs if len(d))
    if tokenizer.kind != "word":
        record.update(words=words, word_ppl=math.exp(total / words))
    log.info("%s%s L=%d S=%d: ppl %.3f over %d tokens", config.posenc.name, method, length, s, record["ppl"], count)
    return record


STRIDE = Option("stride", None, "perplexity: sliding-window stride; 0 = nonoverlapping (default: config.eval.stride)",
                domain=at_least(0), example="--stride=32")
MAX_TOKENS = Option("max_tokens", None, "perplexity: score only the first N tokens of the split (0 = all of it; "
                    "default: config.eval.max_tokens)", domain=at_least(0), example="--max_tokens=100000")


DOCUMENT_SETS = ("books",)
DOCUMENTS = Option("documents", None, "perplexity: score these documents in place of the run's split: books (the four "
                   "Gutenberg books of corpora/books.py, each its own document; --max_tokens: the first N tokens of "
                   "each)", kind=str, choices=DOCUMENT_SETS)


def _check(target: Target, request: Request) -> EvalSpec:
    spec = eval_spec(target.config, target.lengths, request.option(STRIDE), request.option(SPLIT),
                     request.option(MAX_TOKENS), target.overrides)
    documents = request.option(DOCUMENTS)
    if not documents:
        return spec
    if request.option(SPLIT):
        raise ValueError(f"--split {request.option(SPLIT)} and --documents {documents} both name the text to score; "
                         f"give one")
    books_lib.big_txt_path()  # not installed: the pip command, before any checkpoint is read
    return dataclasses.replace(spec, split=documents)


def _line(r: dict) -> str:
    extra = f"  word ppl {r['word_ppl']:.2f}" if "word_ppl" in r else ""
    method = f"  {r['method']}" if r.get("method") else ""
    return (f"{r['scheme']:>12}{method}  L={r['eval_length']:>6}  S={r['stride']:>6}  tokens {r['tokens']:>9,}  "
            f"ppl {r['ppl']:10.3f}{extra}")


def _recorded(recs: list[dict], header: dict, spec: EvalSpec) -> dict[int, list[dict]]:
    """{length: its record} of the records in `recs` from this checkpoint, method, overrides and `spec`."""
    return {int(r["eval_length"]): [r] for r in recs if same_evaluation(r, header) and r.get("split") == spec.split
            and _same_tokens(r, spec.max_tokens) and r["stride"] == (spec.stride or r["eval_length"])}


def _same_tokens(record: dict, max_tokens: int) -> bool:
    """Whether `record` scored the tokens that `max_tokens` asks for: its own first max_tokens, or the
    whole split where that holds no more than max_tokens."""
    scored = records.series_key(record)[2]  # 0: the whole split (records.py)
    return scored == max_tokens or (not scored and max_tokens >= int(record["tokens"]))


KIND = EvalKind("perplexity", "score perplexity: the default when neither --passkey nor --attention is given; "
                "add it to them to score it too", (STRIDE, SPLIT, MAX_TOKENS, DOCUMENTS), _check,
                lambda scoring, spec, batch_tokens: _evaluate(scoring, spec, batch_tokens), _line, "eval",
                default=True, recorded=_recorded)
