#!/usr/bin/env bash
# A DSL all-reduce plan on the GPU through libmscclpp_nccl (issue 30), 2 ranks sharing the one
# GPU under MPS, NVLS off:
#   0. the plan: mscclpp.language.examples.collectives.allreduce(2) (docs/dsl-tutorial.md),
#      written by the GPU machine's Python from this checkout's sources into a plan directory;
#   1. nccl-tests all_reduce_perf (an MPI build: .nccl-tests/build's when it links libmpi, else
#      built here from .nccl-tests with MPI=1) under mpirun -np 2, LD_PRELOAD of our library,
#      once with MSCCLPP_CACHE_DIR empty (native) and once with the plan: each must exit 0 with
#      0 wrong, the INFO log must name the plan on both ranks (rank 0 and rank 1) in the plan
#      run, say "declined" nowhere, and never name the plan in the native one; a table puts the
#      in-place time of the plan next to the native one;
#   2. PyTorch (dsl_torch.py): in-place all_reduce of tensors (from the NCCL backend's memory
#      pool, or plain torch tensors where PyTorch refuses the pool: the executor adopts them),
#      checked exactly, with and without the plan; the plan run's log must name the plan on
#      both ranks and say "declined" nowhere.
# The last line is "N passed, N failed, 0 skipped"; exit 1 on a failure.
# Usage (repository root, binaries staged by `bash .ci/gpu-check --stage` and unpacked in
# .gpu/bin): bash core/python/tests/gpu/dsl_plan_gpu.sh
# Env: OUT (logs, default /tmp/mscclpp_dsl_plan_gpu), BIN (default .gpu/bin), MSCCLPP_NCCL_SO
# (default $BIN/libmscclpp_nccl.so), PY (default /opt/torch/.venv/bin/python), DSL_ARGS
# (all_reduce_perf flags, default "-b 1K -e 64M -f 4 -d float -n 20 -w 5"), DSL_PORT (PyTorch
# rendezvous, default 29671), DSL_MPS=0 (do not start/stop the MPS daemon: it is up already).
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/mscclpp_dsl_plan_gpu}
BIN=${BIN:-$ROOT/.gpu/bin}
if [ -z "${MSCCLPP_NCCL_SO:-}" ] && [ -f "$BIN/libmscclpp_nccl.so" ]; then export MSCCLPP_NCCL_SO=$BIN/libmscclpp_nccl.so; fi
. "$ROOT/core/nccl/tests/gpu/common.sh"
PY=${PY:-/opt/torch/.venv/bin/python}
ARGS=${DSL_ARGS:--b 1K -e 64M -f 4 -d float -n 20 -w 5}
PORT=${DSL_PORT:-29671}
PLAN=dsl_allreduce_n2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
say "library: $LIB; python: $PY; GPU: $(nvidia-smi -L 2>/dev/null | head -1)"
[ -f "$LIB" ] || { verdict "libmscclpp_nccl.so exists" 0 "($LIB)"; say "$PASSES passed, $FAILS failed, 0 skipped"; exit 1; }
MPS_STARTED=0
if [ "${DSL_MPS:-1}" = 1 ] && nvidia-cuda-mps-control -d 2>/dev/null; then MPS_STARTED=1; fi

# ---- 0. the plan -----------------------------------------------------------------------------
PD=$W/plans EMPTY=$W/empty
mkdir -p "$PD" "$EMPTY"
# The DSL is standard-library Python: core/plans/plans.py loads it from the sources without
# the native module.
"$PY" "$ROOT/core/plans/plans.py" example allreduce 2 >"$PD/$PLAN.json" 2>"$OUT/plan.log"
verdict "DSL all-reduce plan for 2 ranks written" $([ -s "$PD/$PLAN.json" ] && echo 1 || echo 0) "(log plan.log)"
cp "$PD/$PLAN.json" "$OUT/" 2>/dev/null

# ---- 1. nccl-tests -----------------------------------------------------------------------------
B=$SRC/build
if ! ldd "$B/all_reduce_perf" 2>/dev/null | grep -q libmpi; then
  # An MPI build of all_reduce_perf against our nccl.h (mpi.h and libmpi where mpicc says).
  inc=$(mpicc --showme:incdirs 2>/dev/null | tr ' ' '\n' | while read -r d; do [ -f "$d/mpi.h" ] && echo "$d" && break; done)
  lib=$(mpicc --showme:libdirs 2>/dev/null | tr ' ' '\n' | while read -r d; do ls "$d"/libmpi.so* >/dev/null 2>&1 && echo "$d" && break; done)
  mkdir -p "$W/mpi/lib"
  ln -s "$inc" "$W/mpi/include"
  ln -s "$(ls "$lib"/libmpi.so* 2>/dev/null | head -1)" "$W/mpi/lib/libmpi.so"
  nccl_home "$W/ncclhome"
  cp -r "$SRC" "$W/nccl-tests"
  B=$W/nccl-tests/build_mpi
  make -C "$W/nccl-tests/src" -j16 MPI=1 MPI_HOME="$W/mpi" CUDA_HOME="$CUDA_HOME" NCCL_HOME="$W/ncclhome" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$B" "$B/all_reduce_perf" >"$OUT/nccl_tests_build.log" 2>&1
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
verdict "all_reduce_perf (MPI build) at $B" $([ -x "$B/all_reduce_perf" ] && echo 1 || echo 0) "(log nccl_tests_build.log if built here)"
XS=()
for v in MSCCLPP_FORCE_DISABLE_NVLS NCCL_NVLS_ENABLE CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY LD_LIBRARY_PATH; do
  [ -n "${!v:-}" ] && XS+=(-x "$v")
done
for mode in native plan; do
  dir=$EMPTY
  [ $mode = plan ] && dir=$PD
  log=$OUT/all_reduce_$mode.log
  # shellcheck disable=SC2086 # ARGS is a list of flags
  timeout 240 mpirun --oversubscribe -np 2 ${XS[@]+"${XS[@]}"} -x NCCL_TESTS_DEVICE=0 -x LD_PRELOAD="$LIB" \
    -x MSCCLPP_CACHE_DIR="$dir" -x MSCCLPP_LOG_LEVEL=INFO -x MSCCLPP_LOG_SUBSYS=COLL \
    "$B/all_reduce_perf" $ARGS -g 1 -c 1 >"$log" 2>&1
  rc=$?
  w=$(wrong_of "$log")
  ran=$(grep -c "runs plan \`$PLAN\`" "$log")
  both=$(for r in 0 1; do grep -q "rank $r: .*runs plan \`$PLAN\`" "$log" && echo "$r"; done | wc -l)
  declined=$(grep -c "declined" "$log")
  if [ $mode = plan ]; then want_ran=$([ "$both" = 2 ] && [ "$declined" = 0 ] && echo 1 || echo 0); else want_ran=$([ "$ran" = 0 ] && echo 1 || echo 0); fi
  verdict "all_reduce_perf -np 2, $mode" $([ $rc = 0 ] && [ "$w" = 0 ] && [ "$want_ran" = 1 ] && echo 1 || echo 0) \
    "(exit $rc, wrong $w, INFO lines naming the plan: $ran, ranks naming it: $both, 'declined': $declined; log $(basename "$log"))"
done
say ""
say "all_reduce_perf -np 2 on one GPU ($ARGS): in-place time (us) native vs the DSL plan (plan: in place, every size)"
printf '%12s %12s %12s\n' bytes native_us plan_us | tee -a "$SUM"
join <(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { print $1, $10 }' "$OUT/all_reduce_native.log" | sort -k1,1) \
  <(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { print $1, $10 }' "$OUT/all_reduce_plan.log" | sort -k1,1) |
  sort -n | awk '{ printf "%12s %12s %12s\n", $1, $2, $3 }' | tee -a "$SUM"

# ---- 2. PyTorch ----------------------------------------------------------------------------------
for mode in native plan; do
  dir=$EMPTY
  [ $mode = plan ] && dir=$PD
  pids=()
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT PYTHONUNBUFFERED=1 LD_PRELOAD="$LIB" \
      MSCCLPP_CACHE_DIR="$dir" MSCCLPP_LOG_LEVEL=INFO MSCCLPP_LOG_SUBSYS=COLL \
      timeout 300 "$PY" "$ROOT/core/python/tests/gpu/dsl_torch.py" >"$OUT/torch_$mode.$r.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  ok=$(cat "$OUT"/torch_$mode.*.log | grep -c "^DSL_TORCH rank=[01] ok=1")
  ran=$(cat "$OUT"/torch_$mode.*.log | grep -c "runs plan \`$PLAN\`")
  both=$(for r in 0 1; do grep -q "runs plan \`$PLAN\`" "$OUT/torch_$mode.$r.log" && echo "$r"; done | wc -l)
  declined=$(cat "$OUT"/torch_$mode.*.log | grep -c "declined")
  if [ $mode = plan ]; then want_ran=$([ "$both" = 2 ] && [ "$declined" = 0 ] && echo 1 || echo 0); else want_ran=$([ "$ran" = 0 ] && echo 1 || echo 0); fi
  verdict "PyTorch all_reduce -np 2, $mode" $([ $rc = 0 ] && [ "$ok" = 2 ] && [ "$want_ran" = 1 ] && echo 1 || echo 0) \
    "(exit $rc, ranks ok $ok/2, INFO lines naming the plan: $ran, ranks naming it: $both, 'declined': $declined; logs torch_$mode.*.log)"
  grep -h "^FAIL " "$OUT"/torch_$mode.*.log | head -5 | sed 's/^/    /' | tee -a "$SUM"
  PORT=$((PORT + 1))
done
say "PyTorch all_reduce, 2 ranks: time per call (us) native vs the DSL plan"
printf '%12s %12s %12s\n' bytes native_us plan_us | tee -a "$SUM"
join <(sed -nE 's/^DSL_TORCH_TIME bytes=([0-9]+) us=(.*)/\1 \2/p' "$OUT/torch_native.0.log" | sort -k1,1) \
  <(sed -nE 's/^DSL_TORCH_TIME bytes=([0-9]+) us=(.*)/\1 \2/p' "$OUT/torch_plan.0.log" | sort -k1,1) |
  sort -n | awk '{ printf "%12s %12s %12s\n", $1, $2, $3 }' | tee -a "$SUM"
[ $MPS_STARTED = 1 ] && echo quit | nvidia-cuda-mps-control
say "$PASSES passed, $FAILS failed, 0 skipped"
[ $FAILS -eq 0 ]
