#!/usr/bin/env bash
# Eager (no CUDA graph) per-call cost of libmscclpp_nccl against the system NCCL on one GPU,
# issue 28 (`bash .ci/gpu-check eager` runs it):
#   1. nccl-tests all_reduce_perf (MPI build, against our nccl.h) at world size 1, eager,
#      -b 1K -e 256M -f 4 -d half -c 0 -n 200 -w 20: the system NCCL and LD_PRELOAD of ours,
#      alternating A B B A A B (EAGER_NT_ROUNDS=3 of each; the fastest per size), MPS off; a
#      table of the time per call, out of place and in place, with "no slower" marks
#      (target: ours <= NCCL at every size). Then the same with the results checked (-c 1,
#      -n 20) for both: exit 0, 0 wrong.
#   2. PyTorch eager all_reduce per call at world size 1 (tests/gpu/torch_eager.py, float32 1 KiB
#      to 256 MiB, the sizes taking turns over 15 rounds, the fastest batch), the system NCCL and
#      ours, alternating A B B A A B (EAGER_ROUNDS=3; the best run of each per size); a table, with the host time
#      to issue a call next to it (host-bound or GPU-bound), and (EAGER_PROFILE=1, the default)
#      torch.profiler's busiest host rows and the GPU work at 16 and 64 KiB for both libraries.
#   3. Under MPS: ours at 2 ranks sharing the GPU, all_reduce_perf -b 1K -e 1K -c 0 -n 200 eager
#      (target <= 4.5 us per call, the fastest of EAGER_NP2_RUNS=3 runs; the system NCCL refuses
#      two ranks on one GPU), and the
#      mp suites ZeroCopyTest and CollectivesEagerTest (driver calls per eager call) at 1, 2
#      and 4 ranks.
# Verdicts (PASS/FAIL lines, counted at the end) are exit codes and wrong elements; the speed
# targets are reported as "target met"/"target missed" lines.
# Usage (repository root; the .so and mp_unit_tests built with --features cuda --release):
#   bash core/nccl/tests/gpu/eager_gpu.sh
# Env: OUT (logs, default /tmp/mscclpp_nccl_eager), MSCCLPP_NCCL_SO, BIN (mp_unit_tests' folder,
# default .gpu/bin), PYTHON (default /opt/torch/.venv/bin/python, else python3), EAGER_CPUS (the
# CPUs the PyTorch runs are pinned to, see part 2), NCCL_TESTS_SRC,
# CUDA_HOME, CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY (MPS for part 3).
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/mscclpp_nccl_eager}
. "$ROOT/core/nccl/tests/gpu/common.sh"
BIN=${BIN:-.gpu/bin}
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps-pipe} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps-log}
say "library: $LIB ($(stat -c %s "$LIB" 2>/dev/null) bytes); $(nvidia-smi -L 2>/dev/null | head -1)"
[ -f "$LIB" ] || { verdict "libmscclpp_nccl.so exists" 0 "($LIB)"; exit 1; }
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1   # parts 1 and 2 without MPS

# The order of n runs of each library, alternating: nccl ours ours nccl nccl ours ...
alternating() {
  local i out=()
  for ((i = 0; i < $1; i++)); do
    if [ $((i % 2)) = 0 ]; then out+=(nccl ours); else out+=(ours nccl); fi
  done
  echo "${out[@]}"
}

# ---- 1. nccl-tests at world size 1, eager ----------------------------------------------------
build_mpi_nccl_tests "all_reduce"
mpi_x_list
EARGS="-b 1K -e 256M -f 4 -d half -c 0 -n 200 -w 20 -g 1"
CARGS="-b 1K -e 256M -f 4 -d half -c 1 -n 20 -w 5 -g 1"
# pre = the launcher of one nccl-tests rank for library $1: mpirun (the MPI build), ours by
# LD_PRELOAD.
nt_launcher() {
  pre=(mpirun --oversubscribe -np 1 ${XS[@]+"${XS[@]}"} -x NCCL_TESTS_DEVICE=0)
  if [ "$1" = ours ]; then pre+=(-x LD_PRELOAD="$LIB" -x MSCCLPP_LOG_LEVEL=INFO -x MSCCLPP_LOG_SUBSYS=NCCL); fi
}
if [ $built = 1 ]; then
  # The eager runs alternate A B B A A B ... (EAGER_NT_ROUNDS of each, default 3) and each size
  # keeps each library's fastest run: one run of each put the two within 0.5 % at 16-256 MiB,
  # either way round from run to run (round 12: the same driver copy on both sides).
  NT_ROUNDS=${EAGER_NT_ROUNDS:-3}
  read -r -a nt_order <<<"$(alternating "$NT_ROUNDS")"
  : >"$W/ws1.nccl.all"; : >"$W/ws1.ours.all"
  declare -A ntrun=([nccl]=0 [ours]=0)
  for v in "${nt_order[@]}"; do
    nt_launcher $v
    k=${ntrun[$v]}
    ntrun[$v]=$((k + 1))
    log=$OUT/ar_ws1_eager.$v.$k.log
    # shellcheck disable=SC2086 # EARGS is a list of flags
    timeout 180 "${pre[@]}" "$B/all_reduce_perf" $EARGS >"$log" 2>&1
    rc=$?
    used=1
    [ $v = ours ] && used=$(grep -c "libmscclpp_nccl: rank 0 of 1" "$log")
    verdict "all_reduce_perf ws1 eager -c 0 ($v, run $((k + 1)))" $([ $rc = 0 ] && [ "$used" -ge 1 ] && echo 1 || echo 0) "(exit $rc; log $(basename "$log"))"
    awk '$1 ~ /^[0-9]+$/ && NF >= 12 { print $1, $6, $10 }' "$log" >>"$W/ws1.$v.all"
    if [ "$k" = 0 ]; then
      # shellcheck disable=SC2086
      timeout 180 "${pre[@]}" "$B/all_reduce_perf" $CARGS >"$OUT/ar_ws1_checked.$v.log" 2>&1
      rc2=$?
      w=$(wrong_of "$OUT/ar_ws1_checked.$v.log")
      verdict "all_reduce_perf ws1 -c 1 ($v)" $([ $rc2 = 0 ] && [ "$w" = 0 ] && echo 1 || echo 0) "(exit $rc2, wrong $w)"
    fi
  done
  # Per size: each library's fastest out-of-place and in-place time over its runs.
  for v in nccl ours; do
    awk '!($1 in o) { n[++c] = $1; o[$1] = $2; i[$1] = $3 } { if ($2 < o[$1]) o[$1] = $2; if ($3 < i[$1]) i[$1] = $3 }
         END { for (k = 1; k <= c; k++) print n[k], o[n[k]], i[n[k]] }' "$W/ws1.$v.all" >"$W/ws1.$v.t"
  done
  # Ours with each copy at every size: the kernel (MSCCLPP_COPY_DRIVER_MAX_BYTES=0) and the
  # driver's copy (MSCCLPP_COPY_KERNEL_MAX_BYTES=0 MSCCLPP_COPY_DRIVER_MAX_BYTES=1G); the
  # default takes the kernel up to 4 MiB, the driver's copy above.
  nt_launcher ours
  for alt in kernel driver; do
    if [ $alt = kernel ]; then xs=(-x MSCCLPP_COPY_DRIVER_MAX_BYTES=0); else xs=(-x MSCCLPP_COPY_KERNEL_MAX_BYTES=0 -x MSCCLPP_COPY_DRIVER_MAX_BYTES=1G); fi
    # shellcheck disable=SC2086
    timeout 180 "${pre[@]}" "${xs[@]}" "$B/all_reduce_perf" $EARGS >"$OUT/ar_ws1_eager.ours_$alt.log" 2>&1
    rc=$?
    verdict "all_reduce_perf ws1 eager -c 0 (ours, $alt copy at every size)" $([ $rc = 0 ] && echo 1 || echo 0) "(exit $rc)"
    awk '$1 ~ /^[0-9]+$/ && NF >= 12 { print $1, $6, $10 }' "$OUT/ar_ws1_eager.ours_$alt.log" >"$W/ws1.$alt.t"
  done
  say ""
  say "all_reduce_perf world size 1, eager (-c 0 -n 200), us per call, fastest of $NT_ROUNDS alternating run(s) each: NCCL oop / ours oop, NCCL ip / ours ip (target: ours <= NCCL); ours oop with the copy kernel, with the driver's copy at every size (one run each)"
  paste -d' ' "$W/ws1.nccl.t" "$W/ws1.ours.t" "$W/ws1.kernel.t" "$W/ws1.driver.t" |
    awk '{ m = (($5 <= $2 && $6 <= $3) ? "target met" : "target missed");
           printf "%12s %9s / %-9s %9s / %-9s %-14s kernel %s driver %s\n", $1, $2, $5, $3, $6, m, $8, $11 }' | tee -a "$SUM"
fi

# ---- 2. PyTorch eager, world size 1 ----------------------------------------------------------
PY=$ROOT/core/nccl/tests/gpu/torch_eager.py
# The libraries alternate, A B B A A B (EAGER_ROUNDS=3, the default),
# and each size keeps its best run of each: a single run of each put differences of up to 9 us
# between two no-ops (ours in place at world size 1 does nothing, NCCL almost nothing) on
# whichever ran second. torch.profiler rows come from each library's first run.
ROUNDS=${EAGER_ROUNDS:-3}
read -r -a order <<<"$(alternating "$ROUNDS")"
# The runs are pinned to the same CPUs (EAGER_CPUS, a taskset list; default 2-5 where taskset
# exists and the machine has 8 or more CPUs; empty: not pinned). nccl-tests above runs under
# mpirun, which binds its rank to a core; the Python runs were not bound, and on the H100
# (round 13) runs of one library differed up to 1.8x (1 KiB: NCCL 15.6 to 28.4 us per call),
# more than any difference between the libraries.
pin=()
cpus=${EAGER_CPUS-$(command -v taskset >/dev/null && [ "$(nproc)" -ge 8 ] && echo 2-5)}
[ -n "$cpus" ] && pin=(taskset -c "$cpus")
say "PyTorch runs pinned to CPUs: ${cpus:-none}"
: >"$W/torch.nccl.all"; : >"$W/torch.ours.all"
declare -A nrun=([nccl]=0 [ours]=0)
for v in "${order[@]}"; do
  pre=()
  [ $v = ours ] && pre=(env LD_PRELOAD="$LIB")
  log="$OUT/torch_eager.$v.${nrun[$v]}.log"
  prof=0
  [ "${nrun[$v]}" = 0 ] && prof=${EAGER_PROFILE:-1}
  nrun[$v]=$((nrun[$v] + 1))
  MASTER_PORT=$([ $v = ours ] && echo 29573 || echo 29572) EAGER_PROFILE=$prof timeout 300 ${pin[@]+"${pin[@]}"} "${pre[@]}" "$PYTHON" "$PY" >"$log" 2>&1
  rc=$?
  done_line=$(grep TORCH_EAGER_DONE "$log" | tail -1)
  verdict "torch_eager.py ws1 ($v, $(basename "$log"))" $([ $rc = 0 ] && echo "$done_line" | grep -q "ok=1" && echo 1 || echo 0) \
    "(exit $rc; ${done_line:-no result, see $(basename "$log")})"
  grep "^TORCH_EAGER " "$log" |
    sed -E 's/.*bytes=([0-9]+) us_per_call=([0-9.]+) issue_us=([0-9.]+) median_us=([0-9.]+).*/\1 \2 \3 \4/' >>"$W/torch.$v.all"
done
# Per size: the best run's time per call and its issue time, and every run's fastest batch and
# median batch (fastest/median).
for v in nccl ours; do
  sort -n -k1,1 -k2,2g "$W/torch.$v.all" |
    awk '{ runs[$1] = runs[$1] (runs[$1] == "" ? "" : ",") $2 "/" $4 } !($1 in best) { best[$1] = $2; issue[$1] = $3; order[++n] = $1 }
         END { for (i = 1; i <= n; i++) print order[i], best[order[i]], issue[order[i]], runs[order[i]] }' >"$W/torch.$v.t"
done
say ""
say "PyTorch eager all_reduce (float32, in place) world size 1, us per call, best of $ROUNDS run(s) each, alternating (sizes taking turns within a run, torch_eager.py): NCCL / ours (target: ours <= NCCL); host time to issue a call: NCCL / ours; every run's fastest/median batch: NCCL | ours"
paste -d' ' "$W/torch.nccl.t" "$W/torch.ours.t" |
  awk '{ printf "%12s %9s / %-9s %-14s issue %s / %s   runs %s | %s\n", $1, $2, $6, ($6 <= $2 ? "target met" : "target missed"), $3, $7, $4, $8 }' | tee -a "$SUM"
# torch.profiler's busiest rows at the sizes around the jump (torch_eager.py EAGER_PROFILE=1).
for v in nccl ours; do
  grep -h "^TORCH_EAGER_PROF " "$OUT"/torch_eager.$v.*.log | sed -E "s/^TORCH_EAGER_PROF rank=[0-9]+ /  $v /" | tee -a "$SUM"
done

# ---- 3. Under MPS: 2 ranks sharing the GPU, and the mp suites ----------------------------------
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"; nvidia-cuda-mps-control -d
M=(mpirun --oversubscribe -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY -x MSCCLPP_FORCE_DISABLE_NVLS -x NCCL_NVLS_ENABLE)
if [ $built = 1 ]; then
  # EAGER_NP2_RUNS runs (default 3), the fastest kept: on the H100 one run of 38.30 us per call
  # came between runs of 5.22 and of 4.39-6.42 (coll_perf) on the same build (round 14).
  runs=() best=""
  for k in $(seq 1 "${EAGER_NP2_RUNS:-3}"); do
    log=$OUT/ar_np2_1k.ours.$k.log
    timeout 180 mpirun --oversubscribe -np 2 ${XS[@]+"${XS[@]}"} -x NCCL_TESTS_DEVICE=0 -x LD_PRELOAD="$LIB" \
      "$B/all_reduce_perf" -b 1K -e 1K -c 0 -n 200 -w 20 -d half -g 1 >"$log" 2>&1
    rc=$?
    us=$(awk '$1 ~ /^[0-9]+$/ && NF >= 12 { print $6; exit }' "$log")
    verdict "all_reduce_perf -np 2 1 KiB eager (ours, run $k)" $([ $rc = 0 ] && [ -n "$us" ] && echo 1 || echo 0) "(exit $rc; $us us per call out of place)"
    [ -n "$us" ] || continue
    runs+=("$us")
    if [ -z "$best" ] || awk -v a="$us" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$us; fi
  done
  say "2 ranks sharing the GPU, eager all-reduce of 1 KiB: ${best:-?} us per call, fastest of ${#runs[@]} run(s) (${runs[*]-}) (target <= 4.5 us): $(awk -v u="${best:-1e9}" 'BEGIN { print (u <= 4.5 ? "target met" : "target missed") }')"
fi
if [ -x "$BIN/mp_unit_tests" ]; then
  for n in 1 2 4; do
    timeout 240 "${M[@]}" -np $n "$BIN/mp_unit_tests" --timeout=30 --filter=ZeroCopyTest,CollectivesEagerTest \
      --ip_port=127.0.0.1:$((29580 + n)) >"$OUT/mp_eager_np$n.log" 2>&1
    rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$OUT/mp_eager_np$n.log" | tail -1)
    verdict "mp_unit_tests ZeroCopyTest,CollectivesEagerTest -np $n" $([ $rc = 0 ] && echo 1 || echo 0) "(exit $rc; $line)"
    grep -h "driver calls per call" "$OUT/mp_eager_np$n.log" | sort -u | head -4 | sed 's/^/    /' | tee -a "$SUM"
  done
else
  verdict "mp_unit_tests present" 0 "($BIN/mp_unit_tests)"
fi
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
say ""
say "$PASSES passed, $FAILS failed; logs in $OUT"
rm -rf "$W"
[ $FAILS -eq 0 ]
