"""Plot and tabulate runs: python report.py DIR [DIR ...] --out OUTDIR

Writes OUTDIR/ppl_vs_length.png (log-scale perplexity against evaluation length, training length
marked, the paper's curves dashed where they match), OUTDIR/loss_by_position.png (loss against
position inside the window) and OUTDIR/ppl_vs_length.md (the numbers, the paper's beside ours).
"""
from absl import app, flags

from experiment import write_report
from experiment.cli import parse_flags, run_cleanly

flags.DEFINE_string("out", "report", "output folder")
flags.DEFINE_enum("paper", "auto", ["auto", "always", "never"],
                  "overlay Press et al. (2022) where scheme and L match: auto = only for WikiText runs")
FLAGS = flags.FLAGS


def main(argv):
    workdirs = argv[1:]

    def go():
        if not workdirs:
            raise ValueError("give at least one run directory: python report.py DIR [DIR ...] --out OUTDIR")
        paths = write_report(workdirs, FLAGS.out, FLAGS.paper)
        print(f"wrote {paths['png']} and {paths['md']}")
    run_cleanly(go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
