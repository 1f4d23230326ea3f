"""RULER's needle in a book (niah_single_2) on Gemma 3 270M (a 32,768-token window; RULER's base template)
at 65,536 tokens, twice its window, every needle placed past the window by design (issue 65): 1.1, 1.35,
1.6 and 1.85 windows back (36,045-60,621 tokens), one needle a prompt, the same prompts for every method.
The training-free methods act on Gemma's global layers only (every sixth; the others keep their
512-token sliding window). results/far_needles_gemma3/.

    python study.py configs/studies/far_needles_gemma3.py                               # resumes
    python study.py configs/studies/far_needles_gemma3.py --param questions=24          # 24 a method
    python study.py configs/studies/far_needles_gemma3.py --param methods=dca           # another method
    python study.py configs/studies/far_needles_gemma3.py --param stretches=disjoint --param questions=12
                                                # 12 prompts whose book stretches share no text
    python study.py configs/studies/far_needles_gemma3.py --check    # one needle within the window (16k)
"""
from experiment.study import Cell, Study

PARAMS = {"questions": 16, "methods": "self_extend,lm_infinite,direct,yarn", "stretches": "random"}
FAR = "1.1w,1.35w,1.6w,1.85w"


def needles(samples: int, length: int, distances: str, methods, stretches: str = "random") -> Cell:
    return Cell(("ruler",), (length,), tuple(methods), {
        "ruler_tasks": ("niah_single_2",), "ruler_template": "base", "samples": samples,
        "needle_distances": tuple(distances.split(",")), "questions_per_prefill": 1,
        **({"haystack_stretches": stretches} if stretches != "random" else {})})


def get_study(p: dict) -> Study:
    within = needles(4, 16384, "0.25w,0.4w", ("direct",))  # 8,192 and 13,107 back: within the window
    far = needles(p["questions"], 65536, FAR, tuple(p["methods"].split(",")), p["stretches"])
    return Study("far_needles_gemma3", "gemma3", (within, far), records=("ruler",), reports=("ruler",),
                 needs=("gemma3", "books"), check=(within,))
