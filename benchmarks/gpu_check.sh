#!/usr/bin/env bash
# The first GPU run, prepared: one script, <= 8 minutes on one GPU.
#
#   bash benchmarks/gpu_check.sh              # on a CUDA machine
#   bash benchmarks/gpu_check.sh --dry-run    # anywhere: CUDA hidden, tiny sizes, claims no GPU figure
#
# 1. pitstop doctor --json
# 2. pitstop profile --trace of each example; pitstop's CUDA-event device span of the traced steps checked
#    against the torch.profiler trace (within 10%, benchmarks/gpu_check.py)
# 3. benchmarks/profile_overhead.py (profiling overhead on this machine)
# 4. pitstop bench --size small
# Results: $GPU_CHECK_RESULTS (default benchmarks/results; for --dry-run the work dir)/gpu_check.md,
# gpu_profile_overhead.md, gpu_bench_small.md; the runs' logs and reports in $GPU_CHECK_WORK (default: a
# temp dir, printed). A dry run marks every file it writes as a dry run.
# Each stage has its own time limit; a stage that fails or times out is recorded as such and the rest run.
set -u
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
WORK=${GPU_CHECK_WORK:-$(mktemp -d /tmp/pitstop-gpu-check.XXXXXX)}
# a dry run leaves benchmarks/results alone unless told where to write
if [ $DRY = 1 ]; then RES=${GPU_CHECK_RESULTS:-$WORK/results}; else RES=${GPU_CHECK_RESULTS:-benchmarks/results}; fi
mkdir -p "$RES" "$WORK"
MD="$RES/gpu_check.md"
start=$(date +%s)

if [ $DRY = 1 ]; then
  export CUDA_VISIBLE_DEVICES=""
  STEPS=(--steps 4 --warmup 2)
  EXAMPLES=("healthy.py --steps 12 --batch-size 16 --features 32")
  OVERHEAD=(--only healthy.py --min-rounds 2 --max-rounds 2 --budget-s 60 --inproc-rounds 1 --block-pairs 4 --block-s 0)
  BENCH=(--size tiny --device cpu --budget 20s --repeats 1 --no-peers --no-compile --no-schedules --ddp 0)
  T_PROFILE=120 T_OVERHEAD=240 T_BENCH=120  # bounds, not targets: steps are 3x longer on some CPUs
else
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    { "$PY" benchmarks/gpu_check.py summary; echo; echo "No CUDA device here: nothing was measured, no GPU figure."; } > "$MD"
    echo "no CUDA device: wrote $MD (nothing measured); use --dry-run to exercise the script on CPU" >&2
    exit 1
  fi
  STEPS=(--steps 20 --warmup 5)
  EXAMPLES=("healthy.py" "item_sync.py" "conv_fp32.py" "slow_loader.py --images 64")
  OVERHEAD=(--min-rounds 2 --max-rounds 3 --budget-s 80)  # end to end only: fits T_OVERHEAD
  BENCH=(--size small --device cuda --budget 75s --no-peers)
  T_PROFILE=50 T_OVERHEAD=120 T_BENCH=100  # with doctor 60: at most 480 s in all
fi

stage() {  # name, limit (s), command...: run it with a time limit, log it, say how it ended
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - t0 ))
  local how="ok"
  [ $rc -ne 0 ] && how="exit $rc"
  [ $rc -eq 124 ] && how="timed out after ${limit}s"
  echo "| $name | $how | ${took}s |" >> "$WORK/stages.md"
  echo "[gpu_check] $name: $how (${took}s)" >&2
  return $rc
}

: > "$WORK/stages.md"
stage doctor 60 "$PY" -m pitstop doctor --json "$WORK/doctor.json" --quiet --no-write

dirs=()
for ex in "${EXAMPLES[@]}"; do
  read -r script args <<< "$ex"
  name="profile_${script%.py}"
  stage "$name" "$T_PROFILE" "$PY" -m pitstop profile --trace "${STEPS[@]}" --out-dir "$WORK/$name" \
    --json "$WORK/$name.json" --quiet -- python "examples/$script" $args
  dirs+=("$WORK/$name")
done
"$PY" benchmarks/gpu_check.py compare "${dirs[@]}" > "$WORK/compare.md"
compare_rc=$?

stage profile_overhead "$T_OVERHEAD" "$PY" benchmarks/profile_overhead.py "${OVERHEAD[@]}" \
  --results "$RES/gpu_profile_overhead.md"
stage bench "$T_BENCH" "$PY" -m pitstop bench "${BENCH[@]}" --markdown "$RES/gpu_bench_small.md" --quiet

if [ $DRY = 1 ]; then  # the overhead and bench tables measured a CPU: say so at their top
  for f in "$RES/gpu_profile_overhead.md" "$RES/gpu_bench_small.md"; do
    [ -f "$f" ] && { printf '> DRY RUN on CPU (CUDA hidden, tiny sizes): not a GPU figure.\n\n'; cat "$f"; } > "$f.tmp" && mv "$f.tmp" "$f"
  done
fi
{
  if [ $DRY = 1 ]; then "$PY" benchmarks/gpu_check.py summary --dry-run; else "$PY" benchmarks/gpu_check.py summary; fi
  echo "- total: $(( $(date +%s) - start ))s; logs and reports: $WORK"
  echo
  echo "## Stages"
  echo
  echo "| stage | result | time |"
  echo "| --- | --- | --- |"
  cat "$WORK/stages.md"
  echo
  echo "## Device timing: pitstop's CUDA events vs torch.profiler (traced steps)"
  echo
  cat "$WORK/compare.md"
  echo
  echo "Profiling overhead: $RES/gpu_profile_overhead.md. Bench: $RES/gpu_bench_small.md."
} > "$MD"
echo "[gpu_check] wrote $MD" >&2
[ $DRY = 1 ] && exit 0
exit $compare_rc
