"""Gemma 3 270M (a 32,768-token window) on four whole books: perplexity at 65,536 tokens (twice the
window) by position band, the training-free methods acting on its global layers only (every sixth),
each against direct and against LM-Infinite on the same tokens. results/books_gemma3/README.md: the
methods committed are LM-Infinite and Self-Extend (a method takes about an hour here).

    python study.py configs/studies/books_gemma3.py                              # resumes
    python study.py configs/studies/books_gemma3.py --param methods=lm_infinite,self_extend,yarn
    python study.py configs/studies/books_gemma3.py --check    # direct at 4k on 4,096 tokens a book (~3 min)
"""
from experiment.study import Cell, Study

PARAMS = {"methods": "lm_infinite,self_extend", "tokens": 65536}


def books(length: int, tokens: int, methods) -> Cell:
    return Cell(("perplexity",), (length,), tuple(methods), {"documents": "books", "max_tokens": tokens})


def get_study(p: dict) -> Study:
    check = books(4096, 4096, ("direct",))
    cells = (books(65536, p["tokens"], tuple(p["methods"].split(","))), check)
    return Study("books_gemma3", "gemma3", cells, records=("perplexity",), reports=("runs",),
                 needs=("gemma3", "books"), check=(check,), tolerance=0.001)
