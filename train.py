"""Train one run: python train.py --config configs/demo.py[:scheme] [--config.a.b=v ...] --workdir DIR

The same command on an existing DIR resumes from its last checkpoint. Once training is complete
the run is evaluated at config.eval.lengths (eval/extrapolation.json).
"""
import sys

from absl import app, flags
from ml_collections import config_flags

from experiment import train_and_evaluate
from experiment.cli import check_scheme_options, parse_flags, run_cleanly

config_flags.DEFINE_config_file("config", None, "experiment config file[:arg]", lock_config=True)
flags.DEFINE_string("workdir", None, "run directory (created, or resumed if it exists)")
flags.DEFINE_integer("max_steps", None, "stop after this many steps in this call (resume later)")
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
