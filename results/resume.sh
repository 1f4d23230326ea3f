# Sourced by the results/*/run.sh of imported models: `resume_from_records W OUT FILE...` copies each
# committed OUT/records/FILE into a new run folder's W/eval/ (one that has no FILE yet), so that a run
# on a new machine resumes from the committed cells (--skip_done skips them) instead of replacing the
# committed records with its own cells alone when it copies W/eval back to OUT/records.
resume_from_records() {
  local w=$1 out=$2 file; shift 2
  for file in "$@"; do
    if [ ! -e "$w/eval/$file" ] && [ -e "$out/records/$file" ]; then
      mkdir -p "$w/eval" && cp "$out/records/$file" "$w/eval/"
    fi
  done
}
