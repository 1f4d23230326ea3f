"""Run this first on a new machine (CPU, GPU or TPU): python selfcheck.py [--short] [--shape paper] [--minutes 10]
[--out DIR]

Every attention path against a float32 reference, per scheme and length (16k tokens in the full
mode), with training and evaluation throughput, planned memory and `auto`'s choice; prints the rows
as they come and writes selfcheck_<device>.json and .md to --out as it goes. Shortest lengths first;
an estimate before the first cell (from an earlier run's times in --out on this device); no cell
started that would end past --minutes (default 10; those left are named; 0 runs every cell). Exit
status 1 if a path the framework would use is wrong here, 3 if a kernel was refused here (named in
the summary, with why), 4 if nothing was checked (every row skipped, n/a or not run), else 0
(experiment/selfcheck/check.py says how each number is taken).
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

import sys

from absl import app, flags

from experiment.cli import define_numbers, parse_flags, run_cleanly
from experiment.selfcheck.check import LENGTHS, MEMORY_GB, MINUTES, make_plan, run

flags.DEFINE_bool("short", False, "the short plan (tiny model, 2 schemes, 2 lengths): CI's machine, a minute")
flags.DEFINE_enum("shape", "small", ["small", "paper"], "the timed decoder's attention shape: small (4 heads of "
                  "64) or paper (the ALiBi paper's 8 heads of 128, L = 512, 4,096 and 16,384)")
flags.DEFINE_string("schemes", "", "comma-separated schemes (default: the plan's)")
define_numbers("lengths", [], "comma-separated lengths (default: the plan's)", domain=LENGTHS,
               example="--lengths=512,4096")
flags.DEFINE_enum("dtype", "", ["", "float32", "bfloat16"], "compute dtype (default: bfloat16 on GPU / TPU, "
                  "float32 on CPU)")
define_numbers("memory_gb", 0.0, "skip programs that plan more than this (default: 90% of the device, "
               "a quarter of the available memory on CPU)", kind=float, domain=MEMORY_GB, example="--memory_gb=8",
               sequence=False)
define_numbers("minutes", 10.0, "start no (scheme, length) cell that would end past this many minutes; the cells "
               "left are named (0: run every cell)", kind=float, domain=MINUTES, example="--minutes=30", sequence=False)
flags.DEFINE_string("out", ".", "folder for selfcheck_<device>.json and .md")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    status = []
    run_cleanly(lambda: status.append(run(make_plan(FLAGS.short, FLAGS.schemes, FLAGS.lengths, FLAGS.dtype,
                                                    FLAGS.memory_gb, FLAGS.shape, FLAGS.minutes), FLAGS.out)[1]))
    sys.exit(status[0] if status else 2)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
