#!/usr/bin/env bash
# Passkey retrieval at demo scale (configs/passkey.py): four schemes trained at L = 64 with half the
# rows passkey examples, then exact-match retrieval at 64 ... 1024 and 5 depths (20 keys per cell).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
W=${W:-runs/passkey}
SCHEMES=${SCHEMES:-alibi rope nope kerple_log}
for s in $SCHEMES; do
  $PY train.py --config "configs/passkey.py:$s" --workdir "$W/$s"
  $PY eval_extrapolate.py --workdir "$W/$s" --passkey
done
$PY report.py $(for s in $SCHEMES; do echo "$W/$s"; done) --out "$W/report"
cp "$W"/report/* results/passkey/  # the report folder is the command's own; its files copied here beside this script
