"""Perplexity at many lengths: python eval_extrapolate.py --workdir DIR [--lengths 64,128] [--stride S]

Nonoverlapping by default (every token scored once); --stride S < L_valid gives the sliding window
(each window re-encodes L_valid - S tokens of context and scores S new ones). Eval-time knobs
switch on without retraining: --set posenc.rope.yarn_scale=8 --set model.attention=blockwise; --set
posenc.name=logn puts log-n scaling (a wrapper that adds no parameters) around the run's scheme.
Results are merged into DIR/eval/extrapolation.json; --passkey adds passkey retrieval
(eval/passkey.json), --attention attention statistics (eval/attention.json).
"""
from absl import app, flags

from experiment import PasskeySpec, evaluate, evaluate_attention, evaluate_passkey
from experiment.cli import overrides_from_flags, parse_flags, run_cleanly
from experiment.run import RunDir

flags.DEFINE_string("workdir", None, "run directory with a checkpoint")
flags.DEFINE_list("lengths", None, "evaluation lengths (default: the run's config.eval.lengths)")
flags.DEFINE_integer("stride", None, "sliding-window stride; 0 = nonoverlapping (default: config.eval.stride)")
flags.DEFINE_enum("split", None, ["train", "valid", "test"], "split to score (default: config.eval.split)")
flags.DEFINE_integer("batch_tokens", None, "tokens per evaluation batch (default: config.eval.batch_tokens)")
flags.DEFINE_integer("max_tokens", None, "score only the first N tokens of the split (0 = all of it; "
                     "default: config.eval.max_tokens)")
flags.DEFINE_multi_string("set", [], "eval-time knob KEY=VALUE, e.g. posenc.rope.yarn_scale=4, or posenc.name=logn "
                          "(log-n around the run's scheme) (repeatable)")
flags.DEFINE_boolean("attention", False, "also write each layer's and head's mean attention distance and "
                     "entropy by query position to DIR/eval/attention.json (first --attention_windows windows)")
flags.DEFINE_alias("attention_stats", "attention")  # the flag's name before 2026-11
flags.DEFINE_integer("attention_windows", 8, "windows per length for --attention")
flags.DEFINE_boolean("passkey", False, "also score passkey retrieval (exact match by length and depth) into "
                     "DIR/eval/passkey.json")
flags.DEFINE_list("passkey_depths", ["0", "0.25", "0.5", "0.75", "1"], "where the key sits: 0 = start, 1 = just before the question")
flags.DEFINE_integer("passkey_per_cell", 20, "examples per (length, depth)")
flags.DEFINE_integer("passkey_digits", None, "digits of the key (default: the run's data.passkey_digits, else 4)")
flags.DEFINE_integer("passkey_seed", 1234, "seed of the passkey examples")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv

    def go():
        lengths = [int(x) for x in FLAGS.lengths] if FLAGS.lengths else None
        overrides = overrides_from_flags(FLAGS.set)
        for r in evaluate(FLAGS.workdir, lengths, FLAGS.stride, FLAGS.split, FLAGS.batch_tokens,
                          max_tokens=FLAGS.max_tokens, overrides=overrides):
            extra = f"  word ppl {r['word_ppl']:.2f}" if "word_ppl" in r else ""
            print(f"{r['scheme']:>12}  L={r['eval_length']:>6}  S={r['stride']:>6}  "
                  f"tokens {r['tokens']:>9,}  ppl {r['ppl']:10.3f}{extra}")
        if FLAGS.passkey:
            spec = PasskeySpec(tuple(float(d) for d in FLAGS.passkey_depths), FLAGS.passkey_per_cell,
                               FLAGS.passkey_seed, FLAGS.passkey_digits)
            for r in evaluate_passkey(FLAGS.workdir, lengths or RunDir(FLAGS.workdir).load_config().eval.lengths,
                                      spec, overrides=overrides):
                print(f"passkey L={r['eval_length']:>6}  depth {r['depth']:.2f}  accuracy {r['accuracy']:.2f}")
        if FLAGS.attention:
            for r in evaluate_attention(FLAGS.workdir, lengths, FLAGS.attention_windows, split=FLAGS.split,
                                        overrides=overrides, batch_tokens=FLAGS.batch_tokens):
                print(f"attention L={r['eval_length']}: {r['windows']} window(s) -> eval/attention.json")
    run_cleanly(go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
