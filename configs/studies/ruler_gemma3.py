"""RULER on Gemma 3 270M (Google; a 32,768-token window, no chat template: RULER's base template) within
its window (4k to 32k) and at twice it (64k), under the training-free methods, which act on its global
layers only (every sixth; the others keep their 512-token sliding window). results/ruler_gemma3/README.md.

    python study.py configs/studies/ruler_gemma3.py            # resumes from the committed records
    python study.py configs/studies/ruler_gemma3.py --check    # niah_single_1 at 4k as trained (~3 min)
"""
from experiment.study import Cell, Study

PARAMS = {"samples4": 6, "samples": 4, "methods": "direct,yarn,self_extend,dca,lm_infinite",
          "methods64": "self_extend,lm_infinite", "tasks64": "niah_single_2"}
ALL_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe", "niah_single_2",
             "niah_single_3", "niah_multivalue", "niah_multiquery")


def ruler(tasks, lengths, samples, methods) -> Cell:
    return Cell(("ruler",), tuple(lengths), tuple(methods), {"ruler_tasks": tuple(tasks), "ruler_template": "base",
                                                             "samples": samples})


def get_study(p: dict) -> Study:
    methods = tuple(p["methods"].split(","))
    cells = (ruler(ALL_TASKS, (4096,), p["samples4"], methods),  # every method is the model as trained here
             ruler(("niah_single_1", "niah_single_2"), (8192, 16384, 32768), p["samples"], methods),
             ruler(tuple(p["tasks64"].split(",")), (65536,), p["samples"], tuple(p["methods64"].split(","))))
    return Study("ruler_gemma3", "gemma3", cells, records=("ruler",), reports=("ruler", "needles"),
                 needs=("gemma3", "books"), check=(ruler(("niah_single_1",), (4096,), p["samples4"], ("direct",)),))
