#!/usr/bin/env bash
# Training-free context extension at demo scale (configs/training_free.py; the survey's experiment):
# a Llama-block RoPE model trained at L = 64 with the passkey mix, exported to Hugging Face's format
# and imported back; the re-imported model evaluated at 64 ... 1024 (perplexity and passkey) with
# every training-free method, each with and without log-n (results/training_free/methods.py); three
# 100-step fine-tunes at 4L from it (PI, YaRN, plain RoPE), evaluated the same way; then the tables and the figure (training_free.png).
# Run from anywhere after the README's set-up; a second run resumes and skips what is done.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
W=${W:-runs/training_free}
OUT=${OUT:-results/training_free}

$PY train.py --config configs/training_free.py --workdir "$W/base"   # trains, then evaluates at L ... 16L
$PY results/training_free/methods.py evaluate "$W/base" --direct_only  # + log-n, + passkey: for the round trip
$PY export_hf.py "$W/base" --out "$W/exported"
[ -e "$W/imported/config.json" ] || $PY import_hf.py "$W/exported" --workdir "$W/imported"
$PY results/training_free/methods.py evaluate "$W/imported"
for method in pi yarn plain; do
  # configs/extend.py takes the imported run's model, data and length; the passkey mix is added back
  $PY train.py --config "configs/extend.py:$method,$W/imported" --config.data.passkey_fraction=0.5 \
      --workdir "$W/$method"
  $PY results/training_free/methods.py evaluate "$W/$method" --direct_only
done
$PY results/training_free/methods.py tables "$W" --out "$OUT"
