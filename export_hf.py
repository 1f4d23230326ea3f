"""Export a run's newest checkpoint in Hugging Face's format: python export_hf.py WORKDIR --out DIR

DIR gets config.json (the run's rope options as rope_parameters), model.safetensors and the run's
tokenizer as tokenizer.json (experiment/convert/hf.py). --set switches eval-time rope options on for the
export, as eval_extrapolate.py's --set does: --set posenc.rope.yarn_scale=4 exports YaRN x4. DIR is new,
empty or an earlier export (never a run folder, nor an unmarked folder of other files); the export's files
replace the earlier export's, and any other file there (your NOTES.md) stays.
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    import os, signal, sys  # noqa: E401 (experiment/runtime/interrupts.py takes over once they are loaded)
    signal.signal(signal.SIGINT, lambda *_: (print("interrupted during start-up; nothing was written",
                                                   file=sys.stderr), os._exit(130)))
    signal.signal(signal.SIGTERM, lambda *_: (print("interrupted during start-up; nothing was written",
                                                    file=sys.stderr), os._exit(143)))  # kill, timeout, SLURM

from absl import app, flags

from experiment.cli import overrides_from_flags, parse_flags, run_cleanly
from experiment.convert.hf import export_hf

flags.DEFINE_string("out", None, "folder for the Hugging Face checkpoint: new, empty or an earlier export")
flags.DEFINE_multi_string("set", [], "eval-time rope option KEY=VALUE to export with, e.g. posenc.rope.yarn_scale=4")
flags.mark_flags_as_required(["out"])
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("give one WORKDIR: python export_hf.py WORKDIR --out DIR")

    def go():
        print(f"exported {argv[1]} to {export_hf(argv[1], FLAGS.out, overrides_from_flags(FLAGS.set))}")
    run_cleanly(go, at_once="interrupted; --out is as it was (an export is written aside and moved in "
                                  "at the end): the same command exports it")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
