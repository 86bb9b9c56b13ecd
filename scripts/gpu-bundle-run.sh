#!/usr/bin/env bash
# Runs on the GPU machine from the bundle folder that `cargo xtask gpu-bundle`
# made: every test binary, the torch cross-check, compute-sanitizer memcheck,
# racecheck, initcheck and synccheck over the CUDA tests (DEEPINFER_SANITIZERS
# picks a subset), the torch peers and the benchmark. Logs (packed into
# $OUT/logs.tgz at the end) and JSON go under $OUT (default ./out). The
# last line is the summary.
#
# DEEPINFER_ONLY="gemm blas" restricts the CUDA tests (tests/cuda_<word>*),
# the sanitizer passes and the benches (benches/<word>*_gpu) to names that
# start with one of the words; device time is scarce, so a run after a change
# to one family need not repeat the others. The sanitizer passes always set
# DEEPINFER_QUICK=1, which the CUDA tests read to use their small shape lists.
# DEEPINFER_BENCH_TIMEOUT (seconds, default 400) bounds each bench but the
# model bench, which is bounded by DEEPINFER_BENCH_BUDGET_S + 120.
# DEEPINFER_SKIP="sanitizer bench" leaves those stages out (a first
# correctness run of new kernels); "main" leaves out the main-job runs
# (`slice` and `run` on cuda:0) that open every pass. DEEPINFER_TEST_TIMEOUT (seconds, default
# 300) bounds each test binary, DEEPINFER_SANITIZER_TIMEOUT (default 400) each
# sanitizer pass. Every binary runs under a time limit, so a
# kernel that hangs costs minutes, not the whole device session.
set -u
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$B/out}"
mkdir -p "$OUT/logs" "$OUT/dump"
# libcuda lives in /usr/local/nvidia/lib64; cuBLAS/cuBLASLt in the CUDA 13.0 toolkit.
export LD_LIBRARY_PATH="/usr/local/nvidia/lib64:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SKIP="${DEEPINFER_SKIP:-}"
skipped() { case " $SKIP " in *" $1 "*) return 0 ;; esac; return 1; }
PY="${PYTHON:-python3}"
DATE="$(date -u +%F)"
COMMIT="$(cat "$B/COMMIT" 2>/dev/null)"
passed=0; failed=0; bins_failed=""
ONLY="${DEEPINFER_ONLY:-}"
# Whether `name` (a test or bench name without its prefix) is selected.
selected() {
  [ -z "$ONLY" ] && return 0
  local w
  for w in $ONLY; do case "$1" in "$w"*) return 0 ;; esac; done
  return 1
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/logs/nvidia-smi.log" 2>&1
# The card's model (h100, h200, ...) names the bench JSON: the device tool
# may lend either, and numbers from different cards are not comparable.
CARD="$(grep -Eo 'H[0-9]+' "$OUT/logs/nvidia-smi.log" | head -n 1 | tr 'H' 'h')"
CARD="${CARD:-gpu}"
if ! skipped main; then
  "$B/bin/deepinfer" info > "$OUT/logs/info.log" 2>&1
  "$B/bin/deepinfer" slice --device cuda:0 > "$OUT/logs/main-job-cuda.log" 2>&1
  echo "slice on cuda: rc=$? ($(tail -n 1 "$OUT/logs/main-job-cuda.log"))"
  # The README's main job (the embedded tiny model, generated on first use) on the GPU.
  DEEPINFER_CACHE="$OUT/cache" "$B/bin/deepinfer" run --device cuda:0 > "$OUT/logs/run-cuda.log" 2>&1
  echo "run on cuda: rc=$? ($(tail -n 1 "$OUT/logs/run-cuda.log"))"
  rm -rf "$OUT/cache"
fi

for t in "$B"/tests/*; do
  name="$(basename "$t")"
  case "$name" in cuda_*) selected "${name#cuda_}" || continue ;; *) [ -n "$ONLY" ] && [ "$name" != errors ] && continue ;; esac
  DEEPINFER_DUMP_DIR="$OUT/dump" timeout "${DEEPINFER_TEST_TIMEOUT:-300}" "$t" --test-threads=1 > "$OUT/logs/test-$name.log" 2>&1
  rc=$?
  p=$(grep -Eo '[0-9]+ passed' "$OUT/logs/test-$name.log" | awk '{s+=$1} END {print s+0}')
  f=$(grep -Eo '[0-9]+ failed' "$OUT/logs/test-$name.log" | awk '{s+=$1} END {print s+0}')
  passed=$((passed + p)); failed=$((failed + f))
  if [ $rc -ne 0 ]; then bins_failed="$bins_failed $name"; [ "$f" = 0 ] && failed=$((failed + 1)); fi
  echo "test $name: rc=$rc passed=$p failed=$f"
done

# SASS of every sm_90a cubin: tensor-core instruction counts per kernel.
if command -v cuobjdump > /dev/null; then
  mkdir -p "$OUT/sass"
  for c in "$B"/cubins/*.cubin; do
    [ -e "$c" ] || continue
    fam="$(basename "$c" .sm_90a.cubin)"
    cuobjdump -sass "$c" > "$OUT/sass/$fam.sass" 2>&1
    awk '/Function :/ {f=$3} /[QH]GMMA|HMMA|QMMA/ {match($0, /[QH]?[GH]?MMA[.A-Z0-9x]*/); n[f" "substr($0, RSTART, RLENGTH)]++}
         END {for (k in n) print k, n[k]}' "$OUT/sass/$fam.sass" | sort > "$OUT/sass/$fam.mma.txt"
    echo "sass $fam: $(awk '{c+=$3} END {print c+0}' "$OUT/sass/$fam.mma.txt") tensor-core instructions ($(cut -d' ' -f2 "$OUT/sass/$fam.mma.txt" | sort -u | tr '\n' ' '))"
  done
fi

torch_line="torch check skipped (slice not selected)"
if selected slice; then
  "$PY" "$B/torch/check_slice.py" "$OUT/dump" > "$OUT/logs/torch-check.log" 2>&1
  torch_line="$(tail -n 1 "$OUT/logs/torch-check.log")"
  echo "$torch_line"
fi
# Keep the tests' text reports (model-forward drift tables and the like); the
# tensor dumps are only for the torch check.
mkdir -p "$OUT/reports"; cp "$OUT"/dump/*.txt "$OUT/reports/" 2>/dev/null
rm -rf "$OUT/dump"

san=""
for tool in ${DEEPINFER_SANITIZERS:-memcheck racecheck initcheck synccheck}; do
  skipped sanitizer && break
  worst=0; summaries=""
  for t in "$B"/tests/cuda_*; do
    name="$(basename "$t")"
    selected "${name#cuda_}" || continue
    # --force-synchronization-limit: the tool keeps per-launch state on the
    # device until the stream syncs; a decode step (or a graph replay) of
    # hundreds of launches without one ran it out of memory ("Internal
    # Sanitizer Error ... Unable to allocate", launches left unchecked:
    # 580 on the engine test, 10,324 on cuda_batch_invariance). A sync every
    # 32 launches: both clean under synccheck (2026-12-04, 25d5fd2).
    DEEPINFER_QUICK=1 timeout "${DEEPINFER_SANITIZER_TIMEOUT:-400}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      --force-synchronization-limit 32 "$t" --test-threads=1 \
      > "$OUT/logs/sanitizer-$tool-$name.log" 2>&1
    rc=$?
    [ $rc -gt $worst ] && worst=$rc
    summary="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitizer-$tool-$name.log" | tail -n 1)"
    echo "compute-sanitizer $tool $name: rc=$rc $summary"
    summaries="$summaries ${summary:-no summary}"
  done
  san="$san $tool:rc=$worst(${summaries# })"
done

# Every benches/<family>_gpu binary: its torch peers (benches/peers/<family>_torch.py)
# first, then ours with the peers merged, one JSON per family.
bench_rc=0
for b in "$B"/benches/*_gpu; do
  fam="$(basename "$b" _gpu)"
  selected "$fam" || continue
  skipped bench && break
  peers="$OUT/peers-$fam.json"
  if [ -f "$B/peers/${fam}_torch.py" ]; then
    timeout 300 "$PY" "$B/peers/${fam}_torch.py" > "$peers" 2> "$OUT/logs/peers-$fam.log" || echo '{}' > "$peers"
  else
    echo '{}' > "$peers"
  fi
  # The model bench keeps to its own budget (DEEPINFER_BENCH_BUDGET_S,
  # whole seconds, default 400) and may overrun it by one point.
  limit="${DEEPINFER_BENCH_TIMEOUT:-400}"
  [ "$fam" = model ] && limit=$(( ${DEEPINFER_BENCH_BUDGET_S:-400} + 120 ))
  DEEPINFER_PEERS_JSON="$peers" DEEPINFER_BENCH_DATE="$DATE" DEEPINFER_COMMIT="$COMMIT" \
    DEEPINFER_BENCH_JSON="$OUT/$DATE-$CARD-$fam.json" timeout "$limit" "$b" --bench > "$OUT/logs/bench-$fam.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && bench_rc=$rc
  cat "$OUT/logs/bench-$fam.log"
done

# The device tool brings back a bounded number of files from $OUT (about 50
# came back on 2026-12-05, the rest were left out): the logs, SASS listings
# and reports go back as one archive beside the JSON, unless
# DEEPINFER_KEEP_LOGS=1 keeps them loose.
if [ "${DEEPINFER_KEEP_LOGS:-0}" != 1 ]; then
  (cd "$OUT" && set -- $(ls -d logs sass reports 2> /dev/null) && [ $# -gt 0 ] \
    && tar czf logs.tgz "$@" && rm -rf "$@")
fi

echo "gpu-bundle $COMMIT: tests $passed passed, $failed failed${bins_failed:+ (failing:$bins_failed)}; $torch_line; sanitizer$san; bench rc=$bench_rc"
