"""RULER's needle in a book (niah_single_2) on SmolLM2-135M-Instruct (an 8,192-token window) with every
needle placed past the window by design (issue 65): at 16,384 tokens, needles 1.1, 1.35, 1.6 and 1.85
windows back, one needle a context, the same contexts for every method. First the control within the
window at 4k (four needles of distinct keys in a context, each asked after one prefill, against one
needle a prompt; four failed it: README.md, so the far cells ask one question a prefill); then one context
of four questions at 16k (the cost of a question with a shared prefill); last, at 32,768 (four windows),
the three best at 16k with needles 1.25 to 3.5 windows back (24 each, as issue 65 asks). results/far_needles_smollm2/.

    python study.py configs/studies/far_needles_smollm2.py                          # resumes
    python study.py configs/studies/far_needles_smollm2.py --param questions=64     # more needles a method
    python study.py configs/studies/far_needles_smollm2.py --param questions_32k=32   # 32k: 32 each
    python study.py configs/studies/far_needles_smollm2.py --check                  # the 4k control, again
"""
from experiment.study import Cell, Study

PARAMS = {"questions": 48, "methods": "self_extend,dca,yarn,dynamic_ntk,direct,lm_infinite,dynamic_yarn",
          "questions_32k": 24, "methods_32k": "self_extend,dca,dynamic_ntk"}
FAR = "1.1w,1.35w,1.6w,1.85w"
FAR_32K = "1.25w,2w,2.75w,3.5w"
NEAR = "500,1500,2500,3500"


def needles(samples: int, length: int, distances: str, k: int, methods) -> Cell:
    return Cell(("ruler",), (length,), tuple(methods), {
        "ruler_tasks": ("niah_single_2",), "ruler_template": "chat", "samples": samples,
        "needle_distances": tuple(distances.split(",")), "questions_per_prefill": k})


def get_study(p: dict) -> Study:
    control = (needles(24, 4096, NEAR, 4, ("direct",)), needles(24, 4096, NEAR, 1, ("direct",)))
    cells = (*control, needles(p["questions"], 16384, FAR, 1, tuple(p["methods"].split(","))),
             needles(4, 16384, FAR, 4, ("direct",)),
             needles(p["questions_32k"], 32768, FAR_32K, 1, tuple(p["methods_32k"].split(","))))
    return Study("far_needles_smollm2", "smollm2", cells, records=("ruler",), reports=("ruler",),
                 needs=("smollm2", "books"), check=control[1:])
