"""Evaluate a trained run: python eval_extrapolate.py --workdir DIR [--lengths 64,128] [--stride S]
[--passkey] [--attention] [--perplexity]

Perplexity by default: nonoverlapping (every token scored once); --stride S < L_valid gives the
sliding window (each window re-encodes L_valid - S tokens of context and scores S new ones).
--passkey scores passkey retrieval (eval/passkey.json) and --attention attention statistics
(eval/attention.json) instead; add --perplexity to score it as well. Eval-time knobs switch on
without retraining: --set posenc.rope.yarn_scale=8 --set model.attention=blockwise; --set
posenc.name=logn puts log-n scaling (a wrapper that adds no parameters) around the run's scheme. Every flag is
checked, for every kind asked, before any of them runs. Results are merged into DIR/eval/.
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    import os, signal, sys  # noqa: E401 (experiment/runtime/interrupts.py takes over once they are loaded)
    signal.signal(signal.SIGINT, lambda *_: (print("interrupted during start-up; nothing was written",
                                                   file=sys.stderr), os._exit(130)))

from absl import app, flags

from experiment.evals import PasskeySpec, evaluate, evaluate_attention, evaluate_passkey
from experiment.cli import define_numbers, overrides_from_flags, parse_flags, run_cleanly
from experiment.evals.request import Request, check_request
from posenc.domains import at_least, between, unit_interval

flags.DEFINE_string("workdir", None, "run directory with a checkpoint")
define_numbers("lengths", None, "evaluation lengths (default: the run's config.eval.lengths)", domain=at_least(1),
               example="--lengths=64,128")
define_numbers("stride", None, "perplexity: sliding-window stride; 0 = nonoverlapping (default: config.eval.stride)",
               domain=at_least(0), example="--stride=32", sequence=False)
flags.DEFINE_enum("split", None, ["train", "valid", "test"], "perplexity, attention: split to score "
                  "(default: config.eval.split)")
define_numbers("batch_tokens", None, "tokens per evaluation batch (default: config.eval.batch_tokens)",
               domain=at_least(1), example="--batch_tokens=16384", sequence=False)
define_numbers("max_tokens", None, "perplexity: score only the first N tokens of the split (0 = all of it; "
               "default: config.eval.max_tokens)", domain=at_least(0), example="--max_tokens=100000", sequence=False)
flags.DEFINE_multi_string("set", [], "eval-time knob KEY=VALUE, e.g. posenc.rope.yarn_scale=4, or posenc.name=logn "
                          "(log-n around the run's scheme) (repeatable)")
flags.DEFINE_boolean("perplexity", None, "score perplexity: the default when neither --passkey nor --attention "
                     "is given; add it to them to score it too")
flags.DEFINE_boolean("attention", False, "write each layer's and head's mean attention distance and entropy by "
                     "query position to DIR/eval/attention.json (first --attention_windows windows)")
flags.DEFINE_alias("attention_stats", "attention")  # the flag's name before 2026-11
define_numbers("attention_windows", 8, "windows per length for --attention", domain=at_least(1),
               example="--attention_windows=8", sequence=False)
flags.DEFINE_boolean("passkey", False, "score passkey retrieval (exact match by length and depth) into "
                     "DIR/eval/passkey.json")
define_numbers("passkey_depths", [0.0, 0.25, 0.5, 0.75, 1.0], "where the key sits: 0 = start, 1 = just before the "
               "question", kind=float, domain=unit_interval(), example="--passkey_depths=0,0.5,1")
define_numbers("passkey_per_cell", 20, "examples per (length, depth)", domain=at_least(1),
               example="--passkey_per_cell=20", sequence=False)
define_numbers("passkey_digits", None, "digits of the key (default: the run's data.passkey_digits, else 4)",
               domain=between(1, 18), example="--passkey_digits=4", sequence=False)
define_numbers("passkey_seed", 1234, "seed of the passkey examples", domain=at_least(0),
               example="--passkey_seed=1234", sequence=False)
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS

# The evaluation kinds each flag acts on: one given for none of the kinds asked would be ignored.
ACTS_ON = {"stride": ("perplexity",), "max_tokens": ("perplexity",), "split": ("perplexity", "attention"),
           "attention_windows": ("attention",), "passkey_depths": ("passkey",), "passkey_per_cell": ("passkey",),
           "passkey_digits": ("passkey",), "passkey_seed": ("passkey",)}


def requested_kinds() -> tuple[str, ...]:
    kinds = tuple(k for k in ("perplexity", "passkey", "attention") if FLAGS[k].value)
    if not kinds and FLAGS.perplexity is None:
        kinds = ("perplexity",)
    if not kinds:
        raise ValueError("nothing to evaluate: give --perplexity, --passkey or --attention")
    for flag, acts_on in ACTS_ON.items():
        if FLAGS[flag].present and not set(acts_on) & set(kinds):
            raise ValueError(f"--{flag} acts on {' and '.join(acts_on)}, which this command does not evaluate "
                             f"({', '.join(kinds)}); add --{acts_on[0]} or drop --{flag}")
    return kinds


def main(argv):
    del argv

    def go():
        passkey = PasskeySpec(tuple(FLAGS.passkey_depths), FLAGS.passkey_per_cell, FLAGS.passkey_seed,
                              FLAGS.passkey_digits)
        request = Request(requested_kinds(), FLAGS.lengths, FLAGS.stride, FLAGS.split, FLAGS.max_tokens,
                          overrides_from_flags(FLAGS.set), passkey, FLAGS.attention_windows)
        check_request(FLAGS.workdir, request)  # every kind's flags, before any of them runs
        lengths, overrides = request.lengths, request.overrides
        if "perplexity" in request.kinds:
            for r in evaluate(FLAGS.workdir, lengths, FLAGS.stride, FLAGS.split, FLAGS.batch_tokens,
                              max_tokens=FLAGS.max_tokens, overrides=overrides):
                extra = f"  word ppl {r['word_ppl']:.2f}" if "word_ppl" in r else ""
                print(f"{r['scheme']:>12}  L={r['eval_length']:>6}  S={r['stride']:>6}  "
                      f"tokens {r['tokens']:>9,}  ppl {r['ppl']:10.3f}{extra}")
        if "passkey" in request.kinds:
            for r in evaluate_passkey(FLAGS.workdir, lengths, passkey, batch_tokens=FLAGS.batch_tokens,
                                      overrides=overrides):
                print(f"passkey L={r['eval_length']:>6}  depth {r['depth']:.2f}  accuracy {r['accuracy']:.2f}")
        if "attention" in request.kinds:
            for r in evaluate_attention(FLAGS.workdir, lengths, FLAGS.attention_windows, split=FLAGS.split,
                                        overrides=overrides, batch_tokens=FLAGS.batch_tokens):
                print(f"attention L={r['eval_length']}: {r['windows']} window(s) -> eval/attention.json")
    run_cleanly(go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
