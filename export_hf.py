"""Export a run's newest checkpoint in Hugging Face's format or as a GGUF file (llama.cpp):

    python export_hf.py WORKDIR --out DIR
    python export_hf.py WORKDIR --gguf OUT.gguf [--type f16|f32|bf16|q8_0] [--force]

DIR gets config.json (the run's rope options as rope_parameters), model.safetensors and the run's
tokenizer as tokenizer.json (experiment/convert/hf.py). OUT.gguf is one file that llama.cpp, Ollama and
LM Studio read, with the rope scaling in its metadata and the tokenizer (experiment/convert/gguf.py);
an existing file is replaced only with --force. --set switches eval-time rope options on for the
export, as eval_extrapolate.py's --set does: --set posenc.rope.yarn_scale=4 exports YaRN x4 (a
method GGUF cannot express, Self-Extend and the like, is refused). DIR is new, empty or an earlier
export (never a run folder, nor an unmarked folder of other files); the export's files replace the
earlier export's, and any other file there (your NOTES.md) stays. Both may be given at once.
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

from absl import app, flags

from experiment.cli import overrides_from_flags, parse_flags, run_cleanly
from experiment.convert.hf import export_hf

flags.DEFINE_string("out", None, "folder for the Hugging Face checkpoint: new, empty or an earlier export")
flags.DEFINE_string("gguf", None, "file for the GGUF checkpoint (llama.cpp): new, or replaced with --force")
flags.DEFINE_string("type", "f16", "tensor type of the GGUF file's weights: f16, f32, bf16 or q8_0")
flags.DEFINE_bool("force", False, "replace an existing --gguf file")
flags.DEFINE_multi_string("set", [], "eval-time rope option KEY=VALUE to export with, e.g. posenc.rope.yarn_scale=4")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("give one WORKDIR: python export_hf.py WORKDIR --out DIR (or --gguf FILE.gguf)")
    if not FLAGS.out and not FLAGS.gguf:
        raise app.UsageError("give --out DIR (a Hugging Face folder) or --gguf FILE.gguf (llama.cpp), or both")

    def go():
        overrides = overrides_from_flags(FLAGS.set)
        if FLAGS.gguf:
            from experiment.convert.gguf import export_gguf
            print(f"exported {argv[1]} to {export_gguf(argv[1], FLAGS.gguf, overrides, FLAGS.type, FLAGS.force)}")
        if FLAGS.out:
            print(f"exported {argv[1]} to {export_hf(argv[1], FLAGS.out, overrides)}")
    run_cleanly(go, at_once="interrupted; --out and --gguf are as they were (an export is written aside and moved "
                            "in at the end): the same command exports it")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
