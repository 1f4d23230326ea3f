#!/usr/bin/env bash
# Context extension at demo scale (configs/extend.py): RoPE trained at L = 64 on the built-in corpus,
# then fine-tuned at 4L = 256 from its parameters with position interpolation, YaRN or plain RoPE,
# for 25 and 100 steps; every run evaluated at 64 ... 1024. Run from anywhere after the README's set-up.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
W=${W:-runs/context_extension}
$PY train.py --config configs/demo.py:rope --workdir "$W/base" \
    --config.eval.lengths=64,128,256,512,1024
# the base with PI / YaRN switched on at evaluation only (no fine-tuning): the "before"
$PY eval_extrapolate.py --workdir "$W/base" --set posenc.rope.pi_factor=0.25
$PY eval_extrapolate.py --workdir "$W/base" --set posenc.rope.yarn_scale=4
for method in pi yarn plain; do
  $PY sweep.py --config "configs/extend.py:$method,$W/base" --schemes rope --grid train.steps=25,100 \
      --workdir "$W/$method"
done
$PY report.py "$W/base" "$W"/pi/rope_L256_steps* "$W"/yarn/rope_L256_steps* "$W"/plain/rope_L256_steps* \
    --out "$W/report"
cp "$W"/report/* results/context_extension/  # the report folder is the command's own; its files copied here
