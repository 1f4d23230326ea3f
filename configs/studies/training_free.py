"""Training-free context extension at demo scale (results/training_free/, configs/training_free.py; the
survey's experiment): a Llama-block RoPE model trained at L = 64 with the passkey mix, exported to
Hugging Face's format and imported back; the re-imported model evaluated at 64 ... 1024 (perplexity and
passkey) with every training-free method, each with and without log-n
(experiment/study/training_free.py); three 100-step fine-tunes at 4L from it (PI, YaRN, plain RoPE),
evaluated the same way; then the tables and the figure (training_free.png).

    python study.py configs/studies/training_free.py          # resumes: what is recorded is not redone
    python study.py configs/studies/training_free.py --check  # the base again, its records compared
"""
from experiment.study import Step, TrainingStudy

PARAMS = {"check_tolerance": 1e-6}  # records and tables at full precision: float sums differ in the last bits
EVALUATE = ("-m", "experiment.study.training_free", "evaluate")


def get_study(p: dict) -> TrainingStudy:
    base = Step(("train.py", "--config", "configs/training_free.py", "--workdir", "{W}/base"))  # + L ... 16L
    steps = [base,
             Step((*EVALUATE, "{W}/base", "--direct_only")),  # + log-n, + passkey: for the round trip
             Step(("export_hf.py", "{W}/base", "--out", "{W}/exported"), done_if="{W}/exported/config.json"),
             Step(("import_hf.py", "{W}/exported", "--workdir", "{W}/imported"), done_if="{W}/imported/config.json"),
             Step((*EVALUATE, "{W}/imported"))]
    for method in ("pi", "yarn", "plain"):
        # configs/extend.py takes the imported run's model, data and length; the passkey mix is added back
        steps += [Step(("train.py", "--config", f"configs/extend.py:{method},{{W}}/imported",
                        "--config.data.passkey_fraction=0.5", "--workdir", f"{{W}}/{method}")),
                  Step((*EVALUATE, f"{{W}}/{method}", "--direct_only"))]
    steps.append(Step(("-m", "experiment.study.training_free", "tables", "{W}", "--out", "{OUT}")))
    check = (base, Step((*EVALUATE, "{W}/base", "--direct_only")),
             Step(("-m", "experiment.study.compare", "records", "{W}/base", "{OUT}/records/base",
                   "--tolerance", str(p["check_tolerance"]))))
    return TrainingStudy("training_free", tuple(steps), check)
