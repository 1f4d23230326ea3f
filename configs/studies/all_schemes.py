"""Every registered scheme and the notable options (configs/all_schemes.py, experiment/pipeline/table.py)
at demo scale with the passkey mix (configs/passkey.py), 600 training steps each (configs/passkey.py
has 1,500: cut so that the whole table fits a day of 2 CPU cores), perplexity and passkey retrieval at
64 ... 1024, then all_schemes.md / .png / .json in results/all_schemes/. Resumes where it stopped.

    python study.py configs/studies/all_schemes.py                              # the table
    python study.py configs/studies/all_schemes.py --param only=fire,dape       # only these rows again
    python study.py configs/studies/all_schemes.py --param part=seeds           # the leading rows, 3 seeds
    python study.py configs/studies/all_schemes.py --check --param only=alibi   # rows again, compared

`only`: the rows named (run folders) are trained again and every other row keeps the committed table's
numbers and times (sweep.py --keep; refused if its protocol differs). `part=seeds`: the rows of
`seeded` (default the three the README ranks first) trained with `seeds` beside the table's own runs
(seed 0: the same run), one table of them in seeds/. The check re-runs the rows of `only` (default
alibi) in a new run folder beside the committed table and compares its rows with it.
"""
from experiment.study import Step, TrainingStudy

PARAMS = {"steps": 600, "only": "", "part": "table", "seeded": "stickbreaking,fox,transformer_xl",
          "seeds": "0,1,2", "check_tolerance": 1e-6}  # full precision: float sums differ in the last bits


def _sweep(p: dict, *more: str) -> Step:
    return Step(("sweep.py", "--config", "configs/all_schemes.py", "--table", "--workdir", "{W}", *more,
                 f"--config.train.steps={p['steps']}", "--config.train.checkpoint_every=200"))


def get_study(p: dict) -> TrainingStudy:
    if p["part"] not in ("table", "seeds"):
        raise ValueError(f"--param part={p['part']}: table or seeds")
    if p["part"] == "seeds":
        steps = (_sweep(p, "--schemes", p["seeded"], "--seeds", p["seeds"], "--out", "{W}/report_seeds"),
                 Step(copy=("{W}/report_seeds/all_schemes.*", "{OUT}/seeds")))
    else:
        only = ("--schemes", p["only"], "--keep", "{OUT}/all_schemes.json") if p["only"] else ()
        steps = (_sweep(p, *only), Step(copy=("{W}/report/all_schemes.*", "{OUT}")))
    rows = p["only"] or "alibi"
    check = (_sweep(p, "--schemes", rows, "--keep", "{OUT}/all_schemes.json"),
             Step(("-m", "experiment.study.compare", "rows", "{W}/report/all_schemes.json", "{OUT}/all_schemes.json",
                   "--rows", rows, "--tolerance", str(p["check_tolerance"]))))
    return TrainingStudy("all_schemes", steps, check)
