# Sourced by gpu_run.sh and gpu_p2p_run.sh (with ROOT, the repository, and OUT, the log folder,
# set): their settings and defaults, the verdict lines of their summary ($OUT/summary.txt) and
# the NCCL home that nccl-tests builds against (our nccl.h, the system's nccl_device.h, the
# system libnccl to link; our library replaces it at run time by LD_PRELOAD). Counts checks in
# PASSES and FAILS; W is a scratch folder, removed at exit.
LIB=$(realpath "${MSCCLPP_NCCL_SO:-$ROOT/target/release/libmscclpp_nccl.so}")
SRC=${NCCL_TESTS_SRC:-$ROOT/.nccl-tests}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SYS_H=${SYS_NCCL_H:-/usr/include/nccl.h}
SYS_LIB=${SYS_NCCL_LIB:-/usr/lib/x86_64-linux-gnu/libnccl.so.2}
W=$(mktemp -d /tmp/mscclpp_nccl_work.XXXX)
trap 'rm -rf "$W"' EXIT
mkdir -p "$OUT"
# NVLink multicast stays off everywhere (it can take the host's shared GPUs out of service).
export MSCCLPP_FORCE_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SUM=$OUT/summary.txt
: >"$SUM"
PASSES=0 FAILS=0
say() { echo "$*" | tee -a "$SUM"; }
verdict() { # verdict NAME OK(0/1) DETAIL
  if [ "$2" = 1 ]; then say "PASS  $1  $3"; PASSES=$((PASSES + 1)); else say "FAIL  $1  $3"; FAILS=$((FAILS + 1)); fi
}
# The wrong-element count of an nccl-tests log (out-of-place + in-place columns; -1: no rows).
# Rows end "time algbw busbw #wrong" twice (out of place, in place); counted from the end, since
# a test without a reduction (hypercube_perf) prints an empty redop column: 12 fields, not 13.
wrong_of() { awk '$1 ~ /^[0-9]+$/ && NF >= 12 { w += $(NF - 4) + $NF; n++ } END { print (n ? w : -1) }' "$1"; }
# nccl_home DIR: DIR/include and DIR/lib as nccl-tests' NCCL_HOME expects them.
nccl_home() {
  mkdir -p "$1/include" "$1/lib"
  cp "$ROOT/core/nccl/include/nccl.h" "$1/include/"
  ln -sf "$(dirname "$SYS_H")/nccl_device.h" "$1/include/nccl_device.h"
  ln -sfn "$(dirname "$SYS_H")/nccl_device" "$1/include/nccl_device"
  ln -sf "$SYS_LIB" "$1/lib/libnccl.so"
}
