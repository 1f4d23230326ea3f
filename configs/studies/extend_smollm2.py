"""Context extension by fine-tuning, the field's headline practice (issue 68, session c; made for a lent GPU):
SmolLM2-135M-Instruct (an 8,192-token window) fine-tuned briefly at 4x its window (32,768 tokens) with
position interpolation (Chen et al. 2023) and with YaRN (Peng et al. 2023), each from the imported
checkpoint (configs/extend.py: a fresh optimizer, the base's tokenizer and chat template), on three of
the four books (corpora/books_folder.py: The Adventures of Sherlock Holmes held out); then each
fine-tune scored on the far-needle cell of results/far_needles_smollm2/ (niah_single_2 at 16,384 tokens,
needles 9,011-15,155 tokens back: the distances that cell measured, so the prompts are its prompts) and
on the held-out book's perplexity at 8k / 16k / 32k, beside the imported model with YaRN and Self-Extend
switched on at evaluation only.

    python study.py configs/studies/extend_smollm2.py       # runs/extend_smollm2, results/extend_smollm2
    bash benchmarks/gpu_first_run.sh --session c ...   # the same on a lent GPU (its header: staging the GGUF)

Params: `source` (what import_hf.py takes: smollm2, or the GGUF file), `methods` (pi,yarn), `factor` (4),
`steps` (120 at batch 1: 3.9M tokens, about 2.5 passes over the three books; the YaRN paper took 400 steps
of 64 x 64k, PI 1,000), `lr` (2e-5, YaRN's), `dtype` (the fine-tune's compute), `questions` (16 far
needles a fine-tune), `ruler_length`, `distances`, `template` (chat), `ppl_lengths`, `ppl_tokens` (of the
held-out book a length). The dry run on a CPU (tests/test_studies.py) sets them for the tiny Llama
fixture: every step end to end in about a minute.
"""
from experiment.study import Step, TrainingStudy

PARAMS = {"source": "smollm2", "methods": "pi,yarn", "factor": 4, "steps": 120, "batch_size": 1, "lr": 2e-5,
          "dtype": "bfloat16", "questions": 16, "ruler_length": 16384, "distances": "9011,11059,13107,15155",
          "template": "chat", "ppl_lengths": "8192,16384,32768", "ppl_tokens": 65536,
          "base_methods": "direct,yarn,self_extend"}


def get_study(p: dict) -> TrainingStudy:
    methods = p["methods"].split(",")
    ruler = ("--ruler", "--ruler_tasks", "niah_single_2", "--ruler_template", p["template"], "--samples",
             str(p["questions"]), "--needle_distances", p["distances"], "--lengths", str(p["ruler_length"]))
    ppl = ("--lengths", p["ppl_lengths"], "--max_tokens", str(p["ppl_tokens"]))
    steps = (
        Step(("-m", "corpora.books_folder", "{W}/books")),
        Step(("import_hf.py", p["source"], "--workdir", "{W}/base", "--data_source", "local",
              "--data_path", "{W}/books"), done_if="{W}/base/config.json"),
        *(Step(("train.py", "--config", f"configs/extend.py:{m},{{W}}/base,{p['factor']}", "--workdir", f"{{W}}/{m}",
                f"--config.train.steps={p['steps']}", f"--config.train.batch_size={p['batch_size']}",
                f"--config.train.lr={p['lr']}", "--config.train.warmup_steps=10",
                f"--config.train.checkpoint_every={p['steps']}", f"--config.model.dtype={p['dtype']}",
                f"--config.eval.lengths={p['ppl_lengths']}", f"--config.eval.max_tokens={p['ppl_tokens']}"))
          for m in methods),
        *(Step(("eval_extrapolate.py", "--workdir", f"{{W}}/{m}", *ruler, "--skip_done")) for m in methods),
        Step(("eval_extrapolate.py", "--workdir", "{W}/base", *ppl, "--methods", p["base_methods"], "--skip_done")),
        Step(("report.py", "{W}/base", *(f"{{W}}/{m}" for m in methods), "--out", "{W}/report")),  # (RULER's too)
        Step(copy=("{W}/report/*", "{OUT}/report")),
        *(Step(copy=(f"{{W}}/{m}/eval/*.json", f"{{OUT}}/records/{m}")) for m in methods),
        Step(copy=("{W}/base/eval/*.json", "{OUT}/records/base")))
    # the check: the books and the import again in a new folder, the imported model's perplexity on the held-out
    # book at the first length, against the committed table (once a GPU has run the study and it is committed)
    first = p["ppl_lengths"].split(",")[0]
    check = (steps[0], steps[1],
             Step(("eval_extrapolate.py", "--workdir", "{W}/base", "--lengths", first, "--max_tokens",
                   str(p["ppl_tokens"]), "--skip_done")),
             Step(("report.py", "{W}/base", "--out", "{W}/report", "--compare_with", "{OUT}/report",
                   "--compare_tolerance", "0.001")))
    return TrainingStudy("extend_smollm2", steps, check)
