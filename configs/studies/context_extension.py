"""Context extension at demo scale (results/context_extension/, configs/extend.py): RoPE trained at
L = 64 on the built-in corpus, evaluated with PI and YaRN switched on at evaluation only (the
"before"), then fine-tuned at 4L = 256 from its parameters with position interpolation, YaRN or plain
RoPE for 25 and 100 steps; every run evaluated at 64 ... 1024, one report.

    python study.py configs/studies/context_extension.py          # resumes
    python study.py configs/studies/context_extension.py --check  # the base again, against its column
"""
from experiment.study import Step, TrainingStudy

PARAMS = {"check_tolerance": 0.0}
METHODS = ("pi", "yarn", "plain")


def get_study(p: dict) -> TrainingStudy:
    tuned = [f"{{W}}/{m}/rope_L256_steps{n}" for m in METHODS for n in (100, 25)]
    base = Step(("train.py", "--config", "configs/demo.py:rope", "--workdir", "{W}/base",
                 "--config.eval.lengths=64,128,256,512,1024"))
    steps = (base,
             Step(("eval_extrapolate.py", "--workdir", "{W}/base", "--set", "posenc.rope.pi_factor=0.25",
                   "--skip_done")),
             Step(("eval_extrapolate.py", "--workdir", "{W}/base", "--set", "posenc.rope.yarn_scale=4",
                   "--skip_done")),
             *(Step(("sweep.py", "--config", f"configs/extend.py:{m},{{W}}/base", "--schemes", "rope", "--grid",
                     "train.steps=25,100", "--workdir", f"{{W}}/{m}")) for m in METHODS),
             Step(("report.py", "{W}/base", *tuned, "--out", "{W}/report")),
             Step(copy=("{W}/report/*", "{OUT}")))
    check = (base, Step(("report.py", "{W}/base", "--out", "{W}/report", "--compare_with", "{OUT}",
                         "--compare_tolerance", str(p["check_tolerance"]))))
    return TrainingStudy("context_extension", steps, check)
