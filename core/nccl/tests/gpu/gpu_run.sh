#!/usr/bin/env bash
# The GPU check of libmscclpp_nccl on a one-GPU machine, in one device call:
#   1. ABI: tests/c/abi_dump.c compiled against our nccl.h and against the system's
#      /usr/include/nccl.h (NCCL 2.28.3) must print the same facts; the function lists of the
#      two headers must match; every declared function must be exported by our .so.
#   2. nccl-tests (source carried in .nccl-tests/) built against OUR nccl.h (plus the system's
#      nccl_device.h), linked to the system NCCL.
#   3. all_reduce/all_gather/reduce_scatter/broadcast_perf at world size 1,
#      -b 1K -e 1G -f 4 -d half -G 10 -n 50 -w 10: once with the system NCCL, once with
#      LD_PRELOAD of our .so; each must exit 0 with 0 wrong elements.
#   4. PyTorch (tests/gpu/torch_allreduce.py) with and without LD_PRELOAD.
#   5. A compact table at the end; logs under $OUT.
# Usage (from the repository root, with the .so built here by
#   cargo build --release -p mscclpp-nccl --features cuda):
#   bash core/nccl/tests/gpu/gpu_run.sh
# Env: OUT (logs, default /tmp/mscclpp_nccl_gpu), MSCCLPP_NCCL_SO (default
# target/release/libmscclpp_nccl.so), NCCL_TESTS_SRC (default .nccl-tests), CUDA_HOME.
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/mscclpp_nccl_gpu}
. "$ROOT/core/nccl/tests/gpu/common.sh"

nvidia-smi -L >"$OUT/gpu.txt" 2>&1
say "GPU: $(head -1 "$OUT/gpu.txt")"
say "library: $LIB ($(stat -c %s "$LIB" 2>/dev/null) bytes)"

# ---- 1. ABI -------------------------------------------------------------------------------
names() { grep -E '^[[:space:]]*(ncclResult_t|const char\*|void)[[:space:]]+p?nccl[A-Za-z]+[[:space:]]*\(' "$1" |
  sed -E 's/^[[:space:]]*(ncclResult_t|const char\*|void)[[:space:]]+(p?nccl[A-Za-z]+).*/\2/' | sort -u; }
names "$ROOT/core/nccl/include/nccl.h" >"$OUT/functions.ours"
names "$SYS_H" >"$OUT/functions.nvidia"
diff "$OUT/functions.nvidia" "$OUT/functions.ours" >"$OUT/functions.diff"
verdict "nccl.h function list == $SYS_H" $([ -s "$OUT/functions.diff" ] && echo 0 || echo 1) \
  "($(wc -l <"$OUT/functions.ours") ours, $(wc -l <"$OUT/functions.nvidia") NVIDIA's; diff in functions.diff)"
ABI_C=$ROOT/core/nccl/tests/c/abi_dump.c
# As C++ (what nccl-tests and PyTorch compile), with the CUDA headers both nccl.h include.
g++ -x c++ -I"$ROOT/core/nccl/include" -I"$CUDA_HOME/include" "$ABI_C" -o "$W/abi_ours" >"$OUT/abi_build.log" 2>&1
g++ -x c++ -I"$(dirname "$SYS_H")" -I"$CUDA_HOME/include" "$ABI_C" -o "$W/abi_nvidia" >>"$OUT/abi_build.log" 2>&1
"$W/abi_ours" >"$OUT/abi.ours" 2>&1
"$W/abi_nvidia" >"$OUT/abi.nvidia" 2>&1
diff "$OUT/abi.nvidia" "$OUT/abi.ours" >"$OUT/abi.diff"
ok=$([ -s "$OUT/abi.ours" ] && [ ! -s "$OUT/abi.diff" ] && echo 1 || echo 0)
verdict "ABI facts (sizes, offsets, initializers, enums, macros) == $SYS_H" "$ok" "($(wc -l <"$OUT/abi.ours") facts; diff in abi.diff)"
nm -D --defined-only "$LIB" | awk '$2 == "T" && $3 ~ /^p?nccl/ { print $3 }' | sort >"$OUT/exports.ours"
missing=$(comm -23 "$OUT/functions.ours" "$OUT/exports.ours" | wc -l)
verdict "every declared function exported" $([ "$missing" = 0 ] && echo 1 || echo 0) \
  "($(wc -l <"$OUT/exports.ours") exported: nm -D --defined-only; $missing missing)"

# ---- 2. nccl-tests against our header ------------------------------------------------------
H=$W/ncclhome
nccl_home "$H"
cp -r "$SRC" "$W/nccl-tests"
if make -C "$W/nccl-tests" -j16 MPI=0 CUDA_HOME="$CUDA_HOME" NCCL_HOME="$H" \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$OUT/nccl_tests_build.log" 2>&1; then
  verdict "nccl-tests built against our nccl.h" 1 ""
else
  verdict "nccl-tests built against our nccl.h" 0 "(see nccl_tests_build.log; building against $SYS_H instead)"
  make -C "$W/nccl-tests" clean >/dev/null 2>&1
  make -C "$W/nccl-tests" -j16 MPI=0 CUDA_HOME="$CUDA_HOME" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$OUT/nccl_tests_build_sys.log" 2>&1
fi
B=$W/nccl-tests/build

# ---- 3. perf runs --------------------------------------------------------------------------
ARGS="-b 1K -e 1G -f 4 -d half -G 10 -n 50 -w 10 -g 1"
TESTS="all_reduce all_gather reduce_scatter broadcast"
for t in $TESTS; do
  timeout 120 "$B/${t}_perf" $ARGS >"$OUT/$t.nccl.log" 2>&1
  rc1=$?
  MSCCLPP_LOG_LEVEL=INFO MSCCLPP_LOG_SUBSYS=NCCL LD_PRELOAD="$LIB" timeout 120 "$B/${t}_perf" $ARGS >"$OUT/$t.mscclpp.log" 2>&1
  rc2=$?
  w1=$(wrong_of "$OUT/$t.nccl.log")
  w2=$(wrong_of "$OUT/$t.mscclpp.log")
  used=$(grep -c "libmscclpp_nccl: rank 0 of 1" "$OUT/$t.mscclpp.log")
  verdict "${t}_perf NCCL" $([ $rc1 = 0 ] && [ "$w1" = 0 ] && echo 1 || echo 0) "(exit $rc1, wrong $w1)"
  verdict "${t}_perf LD_PRELOAD libmscclpp_nccl" $([ $rc2 = 0 ] && [ "$w2" = 0 ] && [ "$used" -ge 1 ] && echo 1 || echo 0) \
    "(exit $rc2, wrong $w2, our init logged $used time(s))"
done
# The world-size-1 copy's two paths side by side: every size through the copy kernel
# (MSCCLPP_COPY_DRIVER_MAX_BYTES=0) next to the default (the kernel up to 4 MiB, the driver's
# copy up to 256 MiB).
MSCCLPP_COPY_DRIVER_MAX_BYTES=0 LD_PRELOAD="$LIB" timeout 120 "$B/all_reduce_perf" $ARGS >"$OUT/all_reduce.mscclpp_kernel.log" 2>&1
rc3=$?; w3=$(wrong_of "$OUT/all_reduce.mscclpp_kernel.log")
verdict "all_reduce_perf LD_PRELOAD, copy kernel at every size" $([ $rc3 = 0 ] && [ "$w3" = 0 ] && echo 1 || echo 0) "(exit $rc3, wrong $w3)"

# ---- 4. PyTorch ----------------------------------------------------------------------------
PY=$ROOT/core/nccl/tests/gpu/torch_allreduce.py
timeout 120 python3 "$PY" >"$OUT/torch.nccl.log" 2>&1
MASTER_PORT=29562 MSCCLPP_LOG_LEVEL=INFO MSCCLPP_LOG_SUBSYS=NCCL LD_PRELOAD="$LIB" timeout 120 python3 "$PY" >"$OUT/torch.mscclpp.log" 2>&1
for v in nccl mscclpp; do
  line=$(grep TORCH_RESULT "$OUT/torch.$v.log" | tail -1)
  verdict "torch.distributed all_reduce ws=1 ($v)" $(echo "$line" | grep -q "ok=1" && echo 1 || echo 0) "${line:-(no result; see torch.$v.log)}"
done
grep -q "libmscclpp_nccl: rank 0 of 1" "$OUT/torch.mscclpp.log"
verdict "torch used libmscclpp_nccl under LD_PRELOAD" $([ $? = 0 ] && echo 1 || echo 0) ""

# ---- 5. table ------------------------------------------------------------------------------
say ""
say "world size 1, -d half -G 10, time per op in us (out-of-place / in-place)"
printf '%-15s %12s %21s %21s\n' test bytes "NCCL oop / ip" "ours oop / ip" | tee -a "$SUM"
for t in $TESTS; do
  for f in nccl mscclpp; do
    awk '$1 ~ /^[0-9]+$/ && NF >= 13 { print $1, $6, $10 }' "$OUT/$t.$f.log" >"$W/$t.$f.t"
  done
  paste -d' ' "$W/$t.nccl.t" "$W/$t.mscclpp.t" | while read -r bytes a b _ c d; do
    printf '%-15s %12s %10s / %-8s %10s / %-8s\n' "$t" "$bytes" "$a" "$b" "$c" "$d"
  done | tee -a "$SUM"
done
awk '$1 ~ /^[0-9]+$/ && NF >= 13 { print $1, $6 }' "$OUT/all_reduce.mscclpp_kernel.log" >"$W/k.t"
say ""
say "all_reduce out-of-place (us): ours default (driver copy <= 256 MiB) / ours copy kernel at every size"
paste -d' ' "$W/all_reduce.mscclpp.t" "$W/k.t" | while read -r bytes a _ _ c; do
  printf '%12s %10s / %-10s\n' "$bytes" "$a" "$c"
done | tee -a "$SUM"
say ""
say "targets (one H200): out-of-place <= 1.0 us at 1 KiB, <= 560 us at 1 GiB"
say "$FAILS failed check(s); logs in $OUT"
rm -rf "$W"
[ $FAILS -eq 0 ]
