"""RULER (Hsieh et al. 2024) on SmolLM2-135M-Instruct (an 8,192-token window) at 4k, 8k, 16k and 32k under
the training-free methods, answers generated greedily in the model's chat template and scored as RULER
scores them (results/ruler_smollm2/README.md). The cells are the commands that made the committed records:
niah_single_1 and the book needle (niah_single_2) at every length, the other tasks at 4k; Self-Extend also
with G=16, W=2,048 (its paper's setting) to 16k; at 32k the four methods committed there.

    python study.py configs/studies/ruler_smollm2.py                 # resumes from the committed records
    python study.py configs/studies/ruler_smollm2.py --check         # niah_single_1 at 4k as trained (~5 min)
    python study.py configs/studies/ruler_smollm2.py --param samples=500   # with a GPU: RULER's own 500
"""
from experiment.study import Cell, Study

PARAMS = {"samples": 6, "methods": "direct,yarn,dynamic_ntk,self_extend,dca,lm_infinite",
          "methods32": "self_extend,dca,yarn,lm_infinite"}
NEEDLES = ("niah_single_1", "niah_single_2")
OTHERS = ("niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe", "niah_single_3")
SE16 = {"posenc.rope.self_extend_window": "2048", "posenc.rope.self_extend_group": "16"}


def ruler(tasks, lengths, samples, methods=(), overrides=None) -> Cell:
    return Cell(("ruler",), tuple(lengths), tuple(methods), {"ruler_tasks": tuple(tasks), "ruler_template": "chat",
                                                             "samples": samples}, dict(overrides or {}))


def get_study(p: dict) -> Study:
    methods, n = tuple(p["methods"].split(",")), p["samples"]
    cells = [ruler(NEEDLES, (4096, 8192, 16384), n, methods), ruler(OTHERS, (4096,), n, methods),
             ruler(NEEDLES, (4096, 8192, 16384), n, overrides=SE16),
             ruler(NEEDLES, (32768,), n, tuple(p["methods32"].split(",")))]
    return Study("ruler_smollm2", "smollm2", tuple(cells), records=("ruler",), reports=("ruler", "needles"),
                 needs=("smollm2", "books"), check=(ruler(("niah_single_1",), (4096,), n, ("direct",)),),
                 quick=(ruler(("niah_single_1",), (4096,), 2, ("direct",)),))
