"""The reduced-scale reproduction (results/wikitext_small/): sinusoidal, rope, t5 and alibi trained on
WikiText-103 valid (raw, byte-level) at L = 64 with seeds 0, 1 and 2 (configs/wikitext_small.py),
nonoverlapping evaluation on the first 262,144 bytes of the test split at L_valid = 64 ... 1024, the
sliding window (stride 64) on its first 32,768 bytes, then the report and the seed-0 tables that the
check compares with. About 30 minutes on 2 CPU cores.

    python study.py configs/studies/wikitext_small.py                   # resumes
    python study.py configs/studies/wikitext_small.py --param seeds=0   # one seed
    python study.py configs/studies/wikitext_small.py --check           # alibi, seed 0, against seed0/ (minutes)
"""
from experiment.study import Step, TrainingStudy

PARAMS = {"seeds": "0,1,2", "check_scheme": "alibi", "check_tolerance": 0.0}
SCHEMES = ("sinusoidal", "rope", "t5", "alibi")


def folder(scheme: str, seed: str) -> str:
    """The run folder sweep.py --seeds gives (seed 0: the plain name)."""
    return f"{{W}}/{scheme}_L64" + ("" if seed == "0" else f"_seed{seed}")


def get_study(p: dict) -> TrainingStudy:
    seeds = p["seeds"].split(",")
    runs = [folder(s, n) for s in SCHEMES for n in seeds]
    seed0 = [folder(s, "0") for s in SCHEMES]
    steps = (Step(("sweep.py", "--config", "configs/wikitext_small.py", "--schemes", ",".join(SCHEMES),
                   "--seeds", p["seeds"], "--workdir", "{W}")),
             *(Step(("eval_extrapolate.py", "--workdir", run, "--lengths", "128,256,512,1024", "--stride", "64",
                     "--max_tokens", "32768", "--skip_done")) for run in runs),
             Step(("report.py", *runs, "--out", "{W}/report")),
             Step(copy=("{W}/report/*", "{OUT}")),
             Step(("report.py", *seed0, "--out", "{W}/report_seed0")),
             Step(copy=("{W}/report_seed0/*.md", "{OUT}/seed0")))
    s = p["check_scheme"]
    check = (Step(("train.py", "--config", f"configs/wikitext_small.py:{s}", "--workdir", f"{{W}}/{s}_L64")),
             Step(("report.py", f"{{W}}/{s}_L64", "--out", "{W}/report", "--compare_with", "{OUT}/seed0",
                   "--compare_tolerance", str(p["check_tolerance"]))))
    return TrainingStudy("wikitext_small", steps, check)
