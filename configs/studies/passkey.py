"""Passkey retrieval at demo scale (results/passkey/, configs/passkey.py): alibi, rope, nope and
kerple_log trained at L = 64 with half the rows passkey examples, each with seeds 0, 1 and 2 (seed 0
in W/<scheme>, seed N in W/<scheme>_seed<N>), exact-match retrieval at 64 ... 1024 and 5 depths (20
keys a cell); the report pools each scheme's seeds (mean +- std, Wilson intervals), and the seed-0
tables are what the check compares with.

    python study.py configs/studies/passkey.py                                   # resumes
    python study.py configs/studies/passkey.py --param schemes=alibi,rope --param seeds=0
    python study.py configs/studies/passkey.py --check        # alibi, seed 0, against seed0/ (minutes)
"""
from experiment.study import Step, TrainingStudy

PARAMS = {"schemes": "alibi,rope,nope,kerple_log", "seeds": "0,1,2", "check_scheme": "alibi",
          "check_tolerance": 0.0}


def folder(scheme: str, seed: str) -> str:
    return f"{{W}}/{scheme}" + ("" if seed == "0" else f"_seed{seed}")


def get_study(p: dict) -> TrainingStudy:
    schemes, seeds = p["schemes"].split(","), p["seeds"].split(",")
    steps = []
    for n in seeds:
        for s in schemes:
            steps += [Step(("train.py", "--config", f"configs/passkey.py:{s}", f"--config.seed={n}", "--workdir",
                            folder(s, n))),
                      Step(("eval_extrapolate.py", "--workdir", folder(s, n), "--passkey", "--skip_done"))]
    steps += [Step(("report.py", *(folder(s, n) for s in schemes for n in seeds), "--out", "{W}/report")),
              Step(copy=("{W}/report/*", "{OUT}")),
              Step(("report.py", *(folder(s, "0") for s in schemes), "--out", "{W}/report_seed0")),
              Step(copy=("{W}/report_seed0/*.md", "{OUT}/seed0"))]
    s = p["check_scheme"]
    check = (Step(("train.py", "--config", f"configs/passkey.py:{s}", "--workdir", f"{{W}}/{s}")),
             Step(("eval_extrapolate.py", "--workdir", f"{{W}}/{s}", "--passkey")),
             Step(("report.py", f"{{W}}/{s}", "--out", "{W}/report", "--compare_with", "{OUT}/seed0",
                   "--compare_tolerance", str(p["check_tolerance"]))))
    return TrainingStudy("passkey", tuple(steps), check)
