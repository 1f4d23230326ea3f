"""Run a grid and report: python sweep.py --config configs/demo.py --schemes sinusoidal,rope,alibi
[--train_lengths 64,128] [--grid train.steps=25,100] [--seeds 0,1,2] --workdir runs/demo [--config.a.b=v ...]

Each (scheme, training length) trains in WORKDIR/<scheme>_L<L>; complete runs are skipped and
interrupted ones resume; the plot and table go to WORKDIR/report. --seeds trains each once per seed
(the config's `seed`: parameter init, data order, passkey mix, dropout), a seed other than the config's
own in WORKDIR/<scheme>_L<L>_seed<N>; the report draws each set of seeds as its mean with a band.

--table: instead of a grid, the rows of the table the --config file gives (its get_table(): every
registered scheme and the notable options in configs/all_schemes.py; experiment/pipeline/table.py),
perplexity and passkey retrieval at each length, then one table and heat map in --out (default
WORKDIR/report); --schemes then names the runs to train and evaluate this time (default: all), and
--seeds the seeds they are trained with (ROW_RUN_seed<N> beside the config's own seed's folder):

    python sweep.py --config configs/all_schemes.py --table --workdir runs/all_schemes
    python sweep.py --config configs/all_schemes.py --table --workdir runs/all_schemes --schemes fox --seeds 0,1,2

--keep FILE (with --table): rows whose runs are not under WORKDIR take their numbers from an earlier
table's all_schemes.json measured under the same protocol, so that a few rows can be re-run alone.
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

import sys

from absl import app, flags
from ml_collections import config_flags

from experiment.cli import check_scheme_options, config_file, define_numbers, parse_flags, run_cleanly
from experiment.pipeline.run import run_config, sweep
from experiment.pipeline.table import build as build_table, rows as table_rows
from posenc.domains import at_least

config_flags.DEFINE_config_file("config", None, "experiment config file[:arg]", lock_config=True)
flags.DEFINE_list("schemes", None, "positional schemes to train (default: the config's posenc.name)")
define_numbers("train_lengths", None, "training lengths (default: the config's train.seq_len)",
               domain=at_least(1), example="--train_lengths=64,128")
define_numbers("seeds", None, "train every run once per seed (default: the config's seed); a seed other than "
               "the config's own adds _seed<N> to the run's folder", domain=at_least(0), example="--seeds=0,1,2")
flags.DEFINE_string("workdir", None, "root folder; one sub-folder per run")
flags.DEFINE_multi_string("grid", [], "KEY=v1,v2: also sweep this config key (repeatable), e.g. train.steps=25,100")
flags.DEFINE_boolean("table", False, "train and evaluate the rows of the --config file's get_table() "
                     "(configs/all_schemes.py: every scheme and the notable options) and write one table of them")
flags.DEFINE_string("out", None, "--table: the report's folder (default: WORKDIR/report)")
flags.DEFINE_string("keep", None, "--table: an earlier table's all_schemes.json, measured under the same protocol: "
                    "rows whose runs are not under WORKDIR keep its numbers (re-run only --schemes)")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv

    def go():
        if FLAGS.table:
            if FLAGS.keep and not FLAGS.schemes:
                raise ValueError("--keep keeps the rows not re-run: name those to re-run with --schemes")
            if FLAGS.train_lengths or FLAGS.grid:
                raise ValueError("--table trains every scheme at the config's train.seq_len; drop --train_lengths "
                                 "and --grid")
            config_path = config_flags.get_config_filename(FLAGS["config"]).partition(":")[0]
            get_table = getattr(config_file(config_path), "get_table", None)
            if not callable(get_table):
                raise ValueError(f"--table: {config_path} has no get_table() (the table's rows); give a config that "
                                 f"has one: --config configs/all_schemes.py")
            table = table_rows(get_table(), f"{config_path}: get_table()")
            paths = build_table(FLAGS.config, table, FLAGS.workdir, FLAGS.out, FLAGS.schemes, seeds=FLAGS.seeds,
                                keep=FLAGS.keep)
            print(f"table: {paths['md']}, {paths['png']}, {paths['json']}")
            if paths["failed"]:
                raise ValueError(f"{len(paths['failed'])} run(s) failed (their cells say so; see the log above): "
                                 + "; ".join(f"{k}: {v}" for k, v in paths["failed"].items()))
            return
        if FLAGS.keep:
            raise ValueError("--keep belongs to --table (an earlier table's rows); drop it")
        schemes = FLAGS.schemes or [FLAGS.config.posenc.name]
        check_scheme_options(sys.argv, [run_config(FLAGS.config, s, None).posenc for s in schemes])
        bad = [g for g in FLAGS.grid if "=" not in g]
        if bad:
            raise ValueError(f"--grid takes KEY=v1,v2, got {bad[0]!r}")
        grid = {k: [v for v in vals.split(",") if v] for k, vals in (g.split("=", 1) for g in FLAGS.grid)}
        paths = sweep(FLAGS.config, schemes, FLAGS.train_lengths or [], FLAGS.workdir, grid, FLAGS.seeds)
        if not paths:  # not the process that writes (several processes as one job)
            return
        print(f"report: {paths['png']} and {paths['md']}")
        print(open(paths["md"]).read())
    run_cleanly(go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
