#!/usr/bin/env bash
# Passkey retrieval at demo scale (configs/passkey.py): four schemes trained at L = 64 with half the
# rows passkey examples, then exact-match retrieval at 64 ... 1024 and 5 depths (20 keys per cell), each
# scheme trained with seeds 0, 1, 2 (SEEDS): seed 0 in W/<scheme>, seed N in W/<scheme>_seed<N> (the
# names sweep.py --seeds gives); the report pools each scheme's seeds (mean +- std, Wilson intervals).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
W=${W:-runs/passkey}
SCHEMES=${SCHEMES:-alibi rope nope kerple_log}
SEEDS=${SEEDS:-0 1 2}
if [ "${1:-}" = "--check" ]; then
  # Reproduction check (a few minutes): one scheme (CHECK_SCHEME) trained with seed 0 and evaluated as
  # below in a fresh folder (CHECK_DIR), its report compared cell by cell with the committed seed-0
  # tables (seed0/); prints the largest difference, fails beyond CHECK_TOLERANCE (relative for
  # perplexity, absolute for accuracy; 0: the same printed digits). Nothing here is written.
  s=${CHECK_SCHEME:-alibi}
  C=${CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/passkey_check.XXXXXX")}
  $PY train.py --config "configs/passkey.py:$s" --workdir "$C/$s"
  $PY eval_extrapolate.py --workdir "$C/$s" --passkey
  exec $PY report.py "$C/$s" --out "$C/report" --compare_with results/passkey/seed0 \
    --compare_tolerance "${CHECK_TOLERANCE:-0}"
fi
folder() { if [ "$2" = 0 ]; then echo "$W/$1"; else echo "$W/$1_seed$2"; fi; }
for n in $SEEDS; do
  for s in $SCHEMES; do
    $PY train.py --config "configs/passkey.py:$s" --config.seed="$n" --workdir "$(folder "$s" "$n")"
    $PY eval_extrapolate.py --workdir "$(folder "$s" "$n")" --passkey --skip_done
  done
done
$PY report.py $(for s in $SCHEMES; do for n in $SEEDS; do folder "$s" "$n"; done; done) --out "$W/report"
cp "$W"/report/* results/passkey/  # the report folder is the command's own; its files copied here beside this script
# seed 0 alone: the tables the reproduction check (--check) compares with
$PY report.py $(for s in $SCHEMES; do folder "$s" 0; done) --out "$W/report_seed0"
mkdir -p results/passkey/seed0 && cp "$W"/report_seed0/*.md results/passkey/seed0/
