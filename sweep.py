"""Run a grid and report: python sweep.py --config configs/demo.py --schemes sinusoidal,rope,alibi
[--train_lengths 64,128] [--grid train.steps=25,100] --workdir runs/demo [--config.a.b=v ...]

Each (scheme, training length) trains in WORKDIR/<scheme>_L<L>; complete runs are skipped and
interrupted ones resume; the plot and table go to WORKDIR/report.
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    import os, signal, sys  # noqa: E401 (experiment/runtime/interrupts.py takes over once they are loaded)
    signal.signal(signal.SIGINT, lambda *_: (print("interrupted during start-up; nothing was written",
                                                   file=sys.stderr), os._exit(130)))

import sys

from absl import app, flags
from ml_collections import config_flags

from experiment.cli import check_scheme_options, define_numbers, parse_flags, run_cleanly
from experiment.pipeline import run_config, sweep
from posenc.domains import at_least

config_flags.DEFINE_config_file("config", None, "experiment config file[:arg]", lock_config=True)
flags.DEFINE_list("schemes", None, "positional schemes to train (default: the config's posenc.name)")
define_numbers("train_lengths", None, "training lengths (default: the config's train.seq_len)",
               domain=at_least(1), example="--train_lengths=64,128")
flags.DEFINE_string("workdir", None, "root folder; one sub-folder per run")
flags.DEFINE_multi_string("grid", [], "KEY=v1,v2: also sweep this config key (repeatable), e.g. train.steps=25,100")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv

    def go():
        schemes = FLAGS.schemes or [FLAGS.config.posenc.name]
        check_scheme_options(sys.argv, [run_config(FLAGS.config, s, None).posenc for s in schemes])
        bad = [g for g in FLAGS.grid if "=" not in g]
        if bad:
            raise ValueError(f"--grid takes KEY=v1,v2, got {bad[0]!r}")
        grid = {k: [v for v in vals.split(",") if v] for k, vals in (g.split("=", 1) for g in FLAGS.grid)}
        paths = sweep(FLAGS.config, schemes, FLAGS.train_lengths or [], FLAGS.workdir, grid)
        if not paths:  # not the process that writes (several processes as one job)
            return
        print(f"report: {paths['png']} and {paths['md']}")
        print(open(paths["md"]).read())
    run_cleanly(go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
