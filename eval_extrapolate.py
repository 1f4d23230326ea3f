"""Evaluate a trained run: python eval_extrapolate.py --workdir DIR [--lengths 64,128] [--stride S]
[--passkey] [--attention] [--perplexity]

Perplexity by default: nonoverlapping (every token scored once); --stride S < L_valid gives the
sliding window (each window re-encodes L_valid - S tokens of context and scores S new ones).
--passkey scores passkey retrieval (eval/passkey.json) and --attention attention statistics
(eval/attention.json) instead; add --perplexity to score it as well. Eval-time knobs switch on
without retraining: --set posenc.rope.yarn_scale=8 --set model.attention=blockwise; --set
posenc.name=logn puts log-n scaling (a wrapper that adds no parameters) around the run's scheme.
--methods direct,yarn,self_extend evaluates each training-free method in turn with its options at
each length (experiment/evals/methods.py; report.py draws one curve per method); --skip_done leaves
out what the run's records already hold, so that a repeated command resumes. Every flag is
checked, for every kind asked, before any of them runs, and the checkpoint is restored once for all of them.
Results are merged into DIR/eval/. The kinds and their flags come from the registry (experiment/evals/kinds.py).
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

from absl import app, flags

from experiment.cli import define_numbers, overrides_from_flags, parse_flags, run_cleanly
from experiment.evals import methods
from experiment.evals.kinds import Request, acts_on, evaluate_kinds, options, registry
from posenc.domains import at_least

KINDS = registry()  # perplexity, passkey, attention: each one's flag and options, defined below

flags.DEFINE_string("workdir", None, "run directory with a checkpoint")
define_numbers("lengths", None, "evaluation lengths (default: the run's config.eval.lengths)", domain=at_least(1),
               example="--lengths=64,128")
define_numbers("batch_tokens", None, "tokens per evaluation batch (default: config.eval.batch_tokens)",
               domain=at_least(1), example="--batch_tokens=16384", sequence=False)
flags.DEFINE_multi_string("set", [], "eval-time knob KEY=VALUE, e.g. posenc.rope.yarn_scale=4, or posenc.name=logn "
                          "(log-n around the run's scheme) (repeatable)")
flags.DEFINE_string("methods", None, "training-free methods to evaluate in turn, each with its options at each length "
                    f"(experiment/evals/methods.py): {','.join(methods.METHODS)}, each also with +logn")
flags.DEFINE_boolean("skip_done", False, "skip the lengths whose records this checkpoint already has with the same "
                     "settings (a repeated command resumes)")
for _kind in KINDS.values():
    flags.DEFINE_boolean(_kind.name, None if _kind.default else False, _kind.help)
    for _alias in _kind.aliases:  # a flag's name before it was renamed
        flags.DEFINE_alias(_alias, _kind.name)
for _option in options(KINDS):
    if _option.choices and _option.sequence:  # a comma-separated list of names (--ruler_tasks)
        flags.DEFINE_list(_option.name, _option.default, f"{_option.help}: {', '.join(_option.choices)}")
        flags.register_validator(_option.name, lambda names, known=_option.choices: all(n in known for n in names or []),
                                 f"each name must be one of {', '.join(_option.choices)} (e.g. {_option.example})")
    elif _option.kind is str and _option.sequence:  # a comma-separated list of free strings (--needle_distances)
        flags.DEFINE_list(_option.name, _option.default, f"{_option.help} (e.g. {_option.example})")
    elif _option.choices:
        flags.DEFINE_enum(_option.name, _option.default, list(_option.choices), _option.help)
    else:
        define_numbers(_option.name, _option.default, _option.help, kind=_option.kind, domain=_option.domain,
                       example=_option.example, sequence=_option.sequence)
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def requested_kinds() -> tuple[str, ...]:
    """The kinds whose flag is given; the default kinds (perplexity) when none is given or refused."""
    kinds = tuple(name for name in KINDS if FLAGS[name].value)
    defaults = [name for name, kind in KINDS.items() if kind.default]
    if not kinds and all(FLAGS[name].value is None for name in defaults):
        kinds = tuple(defaults)
    if not kinds:
        names = [f"--{name}" for name in KINDS]
        raise ValueError(f"nothing to evaluate: give {', '.join(names[:-1])} or {names[-1]}")
    for flag, kinds_of_flag in acts_on(KINDS).items():
        if FLAGS[flag].present and not set(kinds_of_flag) & set(kinds):
            raise ValueError(f"--{flag} acts on {' and '.join(kinds_of_flag)}, which this command does not evaluate "
                             f"({', '.join(kinds)}); add --{kinds_of_flag[0]} or drop --{flag}")
    return kinds


def main(argv):
    del argv

    def go():
        values = {option.name: FLAGS[option.name].value for option in options(KINDS)}
        request = Request(tuple(FLAGS.lengths) if FLAGS.lengths else None, overrides_from_flags(FLAGS.set),
                          FLAGS.batch_tokens, options=values,
                          methods=methods.parse(FLAGS.methods) if FLAGS.methods is not None else (),
                          skip_done=FLAGS.skip_done)
        evaluate_kinds(FLAGS.workdir, requested_kinds(), request, say=print)  # every kind checked, then scored
    run_cleanly(go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
