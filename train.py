"""Train one run: python train.py --config configs/demo.py[:scheme] [--config.a.b=v ...] --workdir DIR

The same command on an existing DIR resumes from its last checkpoint. Once training is complete
the run is evaluated at config.eval.lengths (eval/extrapolation.json).
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

import sys

from absl import app, flags
from ml_collections import config_flags

from experiment.cli import check_scheme_options, define_numbers, parse_flags, run_cleanly
from experiment.pipeline.run import train_and_evaluate
from posenc.domains import at_least

config_flags.DEFINE_config_file("config", None, "experiment config file[:arg]", lock_config=True)
flags.DEFINE_string("workdir", None, "run directory (created, or resumed if it exists)")
define_numbers("max_steps", None, "stop after this many steps in this call (resume later; 0: set the run up)",
               domain=at_least(0), example="--max_steps=100", sequence=False)
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv

    def go():
        check_scheme_options(sys.argv, [FLAGS.config.posenc])
        train_and_evaluate(FLAGS.config, FLAGS.workdir, max_steps=FLAGS.max_steps)
    run_cleanly(go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
