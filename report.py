"""Plot and tabulate runs: python report.py DIR [DIR ...] --out OUTDIR

Writes OUTDIR/ppl_vs_length.png (log-scale perplexity against evaluation length, one panel per unit:
byte, BPE token, word; training length marked, the paper's curves dashed where they match),
OUTDIR/loss_by_position.png (loss against position inside the window) and OUTDIR/ppl_vs_length.md
(the numbers, one table per unit, split and series, the paper's beside ours).

--table: DIR is the root of a table of every scheme (sweep.py --table); writes OUTDIR/all_schemes.md,
.png and .json from its records again (experiment/report/schemes.py).
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    import os, signal, sys  # noqa: E401 (experiment/runtime/interrupts.py takes over once they are loaded)
    signal.signal(signal.SIGINT, lambda *_: (print("interrupted during start-up; nothing was written",
                                                   file=sys.stderr), os._exit(130)))

from absl import app, flags

from experiment.cli import parse_flags, run_cleanly
from experiment.report import PAPER_MODES, schemes, write_report
from experiment.report.runs import refuse_folders_of_runs

flags.DEFINE_string("out", "report", "output folder")
flags.DEFINE_enum("paper", "auto", list(PAPER_MODES),
                  "overlay Press et al. (2022): auto = only where dataset (WikiText-103), split (valid), "
                  "unit (word), scheme and L match theirs; always = wherever scheme and L match")
flags.DEFINE_boolean("table", False, "DIR is a table root (sweep.py --table): write the table of every scheme")
FLAGS = flags.FLAGS


def main(argv):
    workdirs = argv[1:]

    def go():
        if not workdirs:
            raise ValueError("give at least one run directory: python report.py DIR [DIR ...] --out OUTDIR")
        if FLAGS.table:
            if len(workdirs) != 1:
                raise ValueError(f"--table takes one table root (sweep.py --table's --workdir), got {len(workdirs)}")
            paths = schemes.write(workdirs[0], FLAGS.out)
            print(f"wrote {paths['md']}, {paths['png']} and {paths['json']}")
            return
        refuse_folders_of_runs(workdirs, FLAGS.out)  # a sweep's root given for its runs
        paths = write_report(workdirs, FLAGS.out, FLAGS.paper)
        print(f"wrote {paths['png']} and {paths['md']}")
        for path in paths.get("attention_pngs", []):
            print(f"wrote {path}")
        if "passkey" in paths:
            print(f"wrote the passkey report: {', '.join(str(v) for v in paths['passkey'].values())}")
        for key, value in paths.items():  # the part of an evaluation kind added later
            if key not in ("png", "md", "positions_png", "attention_pngs", "passkey"):
                print(f"wrote {key}: {value}")
    run_cleanly(go, at_once="interrupted; --out is as it was (a report is written aside and swapped in "
                                  "whole): the same command writes it")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
