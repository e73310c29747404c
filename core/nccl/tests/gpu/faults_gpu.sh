#!/usr/bin/env bash
# Fault checks of libmscclpp_nccl on a one-GPU machine, 2 and 4 ranks sharing GPU 0 (run with
# the MPS daemon up, as `.ci/gpu-check nccl` does; NVLink multicast off, common.sh):
#   1. kill (C, core/nccl/tests/c/faults_gpu.c): the last rank SIGKILLs itself while its
#      all-reduce kernel runs; every survivor, polling ncclCommGetAsyncError as PyTorch's
#      watchdog does, must see the error within 2 s of the death.
#   2. abort (C): ncclCommAbort from another thread while rank 0's all-reduce waits for ranks
#      that never join; the stream must finish within 1 s of the abort.
#   3. torch (core/nccl/tests/gpu/torch_faults.py): the last rank dies in the middle of an
#      all-reduce; every survivor's all-reduce (or the watchdog) must fail within 2 s.
# A survivor errs when it prints its error, or (PyTorch's watchdog may end the process first)
# when it exits with a non-zero status. Prints a table and "N passed, N failed, 0 skipped";
# exit 1 on a failure.
# Usage (repository root; the library built with --features cuda and staged):
#   bash core/nccl/tests/gpu/faults_gpu.sh
# Env: OUT (logs, default /tmp/mscclpp_nccl_gpu_faults), MSCCLPP_NCCL_SO (default
# target/release/libmscclpp_nccl.so), CUDA_HOME, FAULTS_NPS (default "2 4"), FAULTS_TORCH=0
# skips PyTorch, FAULTS_PORT (PyTorch's first rendezvous port, default 29671), PYTHON (default
# /opt/torch/.venv/bin/python when present, else python3).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd) || exit 1
NPS=${FAULTS_NPS:-2 4} PORT=${FAULTS_PORT:-29671} OUT=${OUT:-/tmp/mscclpp_nccl_gpu_faults}
. "$ROOT/core/nccl/tests/gpu/common.sh"
PY=${PYTHON:-$([ -x /opt/torch/.venv/bin/python ] && echo /opt/torch/.venv/bin/python || echo python3)}
[ -f "$LIB" ] || { verdict "libmscclpp_nccl.so exists" 0 "($LIB)"; say "$PASSES passed, $FAILS failed, 0 skipped"; exit 1; }
say "library: $LIB; GPU: $(nvidia-smi -L 2>/dev/null | head -1)"
EXE=$W/faults_gpu
if gcc -std=c11 -D_GNU_SOURCE -O1 -I"$CUDA_HOME/include" -I"$ROOT/core/nccl/include" \
  "$ROOT/core/nccl/tests/c/faults_gpu.c" -o "$EXE" -L"$(dirname "$LIB")" -l:"$(basename "$LIB")" \
  -Wl,-rpath,"$(dirname "$LIB")" -L"$CUDA_HOME/lib64" -lcudart -lpthread >"$OUT/build.log" 2>&1; then
  verdict "faults_gpu.c built against our nccl.h and $(basename "$LIB")" 1 ""
else
  verdict "faults_gpu.c built" 0 "(log: build.log)"; say "$PASSES passed, $FAILS failed, 0 skipped"; exit 1
fi
TABLE=()
# exit_time LOG CMD...: runs CMD with its output in LOG, then appends "EXIT rc=N at_us=T" (the
# watchdog may end a survivor before it prints anything: its exit is then its error).
exit_time() {
  local log=$1 rc
  shift
  "$@" >"$log" 2>&1
  rc=$?
  echo "EXIT rc=$rc at_us=$(date +%s%6N)" >>"$log"
}
# ranks MODE NP: NP ranks of the C program in MODE, logs $OUT/MODE_npNP.R.log; waits for all.
ranks() {
  local mode=$1 np=$2 pids=() r p
  rm -f "$W/id.$mode$np"
  for r in $(seq 0 $((np - 1))); do
    exit_time "$OUT/${mode}_np$np.$r.log" env RANK=$r NRANKS=$np FAULTS_MODE=$mode FAULTS_ID_FILE=$W/id.$mode$np timeout 60 "$EXE" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
# check_deaths NAME LOGPREFIX NP: the victim's death time against every survivor's error time.
check_deaths() {
  local name=$1 pre=$2 np=$3 died worst=0 ok=1 got=0
  died=$(cat "$pre".*.log | sed -nE 's/.*VICTIM rank=[0-9]+ dies_at_us=([0-9]+).*/\1/p' | head -1)
  for r in $(seq 0 $((np - 2))); do
    local at
    at=$(sed -nE 's/.*SURVIVOR rank=[0-9]+ error_at_us=([0-9]+).*/\1/p' "$pre.$r.log" | head -1)
    # No error line: a process the watchdog ended (non-zero exit) erred when it exited.
    [ -z "$at" ] && grep -qE "^EXIT rc=[1-9]" "$pre.$r.log" &&
      at=$(sed -nE 's/^EXIT rc=[0-9]+ at_us=([0-9]+).*/\1/p' "$pre.$r.log" | head -1)
    if [ -z "$died" ] || [ -z "$at" ] || [ "$at" = 0 ]; then ok=0; continue; fi
    got=$((got + 1))
    local ms=$(((at - died) / 1000))
    [ $ms -gt $worst ] && worst=$ms
    [ $ms -lt 2000 ] || ok=0
  done
  TABLE+=("$(printf '%-34s %3s ranks  %3d/%d survivors erred  worst %6s ms (limit 2000)' "$name" "$np" $got $((np - 1)) "$worst")")
  verdict "$name at $np ranks: every survivor errs within 2 s of the death" $ok \
    "(survivors with an error: $got/$((np - 1)), worst $worst ms; logs $(basename "$pre").*.log)"
}
for np in $NPS; do
  # ---- 1. kill, C ----
  ranks kill "$np"
  check_deaths "C: rank killed mid all-reduce" "$OUT/kill_np$np" "$np"
  # ---- 2. abort, C ----
  ranks abort "$np"
  line=$(grep -h "^ABORT " "$OUT/abort_np$np.0.log" | head -1)
  a=$(echo "$line" | sed -nE 's/.*abort_at_us=([0-9]+).*/\1/p'); d=$(echo "$line" | sed -nE 's/.*done_at_us=([0-9]+).*/\1/p')
  ms=-1; [ -n "$a" ] && [ -n "$d" ] && [ "$d" != 0 ] && ms=$(((d - a) / 1000))
  TABLE+=("$(printf '%-34s %3s ranks  stream done %6s ms after the abort (limit 1000; -1: not in 10 s)' "C: ncclCommAbort, blocked" "$np" "$ms")")
  verdict "ncclCommAbort from another thread ends a blocked all-reduce within 1 s at $np ranks" \
    $([ "$ms" -ge 0 ] && [ "$ms" -lt 1000 ] && echo 1 || echo 0) "($ms ms; log abort_np$np.0.log)"
  # ---- 3. PyTorch ----
  if [ "${FAULTS_TORCH:-1}" = 1 ]; then
    pids=()
    for r in $(seq 0 $((np - 1))); do
      exit_time "$OUT/torch_np$np.$r.log" env RANK=$r WORLD_SIZE=$np MASTER_ADDR=127.0.0.1 MASTER_PORT=$((PORT + np)) \
        PYTHONUNBUFFERED=1 LD_PRELOAD="$LIB" TORCH_NCCL_ASYNC_ERROR_HANDLING=1 timeout 90 "$PY" \
        "$ROOT/core/nccl/tests/gpu/torch_faults.py" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    check_deaths "PyTorch (watchdog): rank killed" "$OUT/torch_np$np" "$np"
  fi
done
say ""
say "summary (one H200, ranks sharing GPU 0):"
for l in "${TABLE[@]}"; do say "  $l"; done
say "$PASSES passed, $FAILS failed, 0 skipped"
[ "$FAILS" = 0 ]
