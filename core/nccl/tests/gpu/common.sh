# Sourced by gpu_run.sh and gpu_p2p_run.sh (with ROOT, the repository, and OUT, the log folder,
# set): their settings and defaults, the MPI build of nccl-tests (build_mpi_nccl_tests) and
# mpirun's variable list (mpi_x_list) of the multi-rank scripts, the verdict lines of their summary ($OUT/summary.txt) and
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi_home() {
  if [ -n "${MPI_HOME:-}" ]; then echo "$MPI_HOME"; return 0; fi
  local d inc="" lib=""
  for d in $(mpicc --showme:incdirs 2>/dev/null); do [ -f "$d/mpi.h" ] && inc=$d && break; done
  for d in $(mpicc --showme:libdirs 2>/dev/null); do ls "$d"/libmpi.so* >/dev/null 2>&1 && lib=$d && break; done
  [ -n "$inc" ] || inc=$(dirname "$(find /usr /opt -name mpi.h -path '*mpi*' 2>/dev/null | head -1)")
  [ -n "$lib" ] || lib=$(dirname "$(find /usr /opt -name 'libmpi.so*' 2>/dev/null | head -1)")
  [ -f "$inc/mpi.h" ] && ls "$lib"/libmpi.so* >/dev/null 2>&1 || return 1
  mkdir -p "$W/mpi/lib"
  ln -s "$inc" "$W/mpi/include"
  ln -s "$(ls "$lib"/libmpi.so* | head -1)" "$W/mpi/lib/libmpi.so"
  echo "$W/mpi"
}
# build_mpi_nccl_tests "TESTS": nccl-tests with MPI=1 against our nccl.h, the perf binaries of
# TESTS (e.g. "all_reduce sendrecv") into $B; sets built=1 on success (a verdict either way).
B=$W/nccl-tests/build_mpi
built=0
build_mpi_nccl_tests() {
  local MPIH t targets=()
  if ! MPIH=$(mpi_home); then
    verdict "nccl-tests MPI build" 0 "(no mpi.h and libmpi.so found: install Open MPI's headers or set MPI_HOME)"
    return
  fi
  # The ranks find libmpi where the build found it.
  export LD_LIBRARY_PATH="$(dirname "$(readlink -f "$MPIH/lib/libmpi.so")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nccl_home "$W/ncclhome"
  cp -r "$SRC" "$W/nccl-tests"
  for t in $1; do targets+=("$B/${t}_perf"); done
  if make -C "$W/nccl-tests/src" -j16 MPI=1 MPI_HOME="$MPIH" CUDA_HOME="$CUDA_HOME" NCCL_HOME="$W/ncclhome" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$B" "${targets[@]}" >"$OUT/nccl_tests_mpi_build.log" 2>&1; then
    built=1
  fi
  verdict "nccl-tests (MPI=1, MPI_HOME $MPIH) built against our nccl.h: $1" $built "(log: nccl_tests_mpi_build.log)"
}
# mpi_x_list: XS, mpirun's -x list of the variables every rank needs, where set.
mpi_x_list() {
  XS=()
  for v in MSCCLPP_FORCE_DISABLE_NVLS NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS \
    CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY LD_LIBRARY_PATH; do
    [ -n "${!v:-}" ] && XS+=(-x "$v")
  done
}
