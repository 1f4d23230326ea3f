"""Plot and tabulate runs: python report.py DIR [DIR ...] --out OUTDIR

Writes OUTDIR/ppl_vs_length.png (log-scale perplexity against evaluation length, one panel per unit:
byte, BPE token, word; training length marked, the paper's curves dashed where they match),
OUTDIR/loss_by_position.png (loss against position inside the window) and OUTDIR/ppl_vs_length.md
(the numbers, one table per unit, split and series, the paper's beside ours).

--table: DIR is the root of a table of every scheme (sweep.py --table); writes OUTDIR/all_schemes.md,
.png and .json from its records again (experiment/report/schemes.py); with --keep FILE (an earlier
table's all_schemes.json), rows whose runs are not under DIR keep that table's numbers.

--compare_with RESULT: after writing the report, compare its tables cell by cell with the committed
ones in RESULT (results/NAME/: ppl_vs_length.md, passkey.md; experiment/report/compare.py), print the
largest difference, and fail if a cell differs by more than --compare_tolerance (python study.py configs/studies/NAME.py
--check does this on a re-run of one scheme).
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

from absl import app, flags

from experiment.cli import define_numbers, parse_flags, run_cleanly
from experiment.report import PAPER_MODES, compare, schemes, write_report
from experiment.report.runs import refuse_folders_of_runs
from posenc.domains import at_least

flags.DEFINE_string("out", "report", "output folder")
flags.DEFINE_enum("paper", "auto", list(PAPER_MODES),
                  "overlay Press et al. (2022): auto = only where dataset (WikiText-103), split (valid), "
                  "unit (word), scheme and L match theirs; always = wherever scheme and L match")
flags.DEFINE_boolean("table", False, "DIR is a table root (sweep.py --table): write the table of every scheme")
flags.DEFINE_string("keep", None, "--table: an earlier table's all_schemes.json (same protocol): rows whose runs are "
                    "not under DIR keep its numbers (sweep.py --table --keep)")
flags.DEFINE_string("compare_with", None, "a committed result's folder (results/NAME): compare this report's tables "
                    "with its tables cell by cell and print the largest difference")
define_numbers("compare_tolerance", 0.0, "--compare_with: the largest difference allowed, relative for perplexities "
               "and absolute for passkey accuracies (0: the same printed digits)", kind=float, domain=at_least(0),
               example="--compare_tolerance=0.01", sequence=False)
FLAGS = flags.FLAGS


def main(argv):
    workdirs = argv[1:]

    def go():
        if not workdirs:
            raise ValueError("give at least one run directory: python report.py DIR [DIR ...] --out OUTDIR")
        if FLAGS.keep and not FLAGS.table:
            raise ValueError("--keep belongs to --table (an earlier table's rows); drop it")
        if FLAGS.table:
            if FLAGS.compare_with:
                raise ValueError("--compare_with compares a report of runs (ppl_vs_length.md, passkey.md); drop it "
                                 "with --table")
            if len(workdirs) != 1:
                raise ValueError(f"--table takes one table root (sweep.py --table's --workdir), got {len(workdirs)}")
            paths = schemes.write(workdirs[0], FLAGS.out, FLAGS.keep)
            print(f"wrote {paths['md']}, {paths['png']} and {paths['json']}")
            return
        refuse_folders_of_runs(workdirs, FLAGS.out)  # a sweep's root given for its runs
        if FLAGS.compare_with:
            compare.check_folder(FLAGS.compare_with)  # before the report is written
        paths = write_report(workdirs, FLAGS.out, FLAGS.paper)
        print(f"wrote {paths['png']} and {paths['md']}")
        for path in paths.get("attention_pngs", []):
            print(f"wrote {path}")
        if "passkey" in paths:
            print(f"wrote the passkey report: {', '.join(str(v) for v in paths['passkey'].values())}")
        for key, value in paths.items():  # the part of an evaluation kind added later
            if key not in ("png", "md", "positions_png", "attention_pngs", "passkey"):
                print(f"wrote {key}: {value}")
        if FLAGS.compare_with:
            text, same = compare.summary(compare.compare(FLAGS.compare_with, FLAGS.out), FLAGS.compare_with,
                                         FLAGS.compare_tolerance)
            print(text)
            if not same:
                raise ValueError(f"--compare_with {FLAGS.compare_with}: the report differs by more than "
                                 f"--compare_tolerance={FLAGS.compare_tolerance:g} (largest differences above; "
                                 f"--compare_tolerance=0.05 allows 5% in perplexity and 0.05 in accuracy)")
    run_cleanly(go, at_once="interrupted; --out is as it was (a report is written aside and moved in "
                                  "at the end): the same command writes it")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
