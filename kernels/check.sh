#!/usr/bin/env bash
# Compile checks for the device code (no GPU needed):
#   1. tests/api_compile.cu (every device API, instantiated) and the semaphore / FIFO test kernels
#      with nvcc for sm_80, sm_90, sm_100 (+PTX). The library's collective kernels
#      (kernels/cuda/src) and the other test kernels are what `cargo build --features cuda`
#      compiles (sm_80/90/100 by default, sm_90 in CI, 2-5 CPU-minutes per arch);
#      ALL_ARCHS=1 compiles every .cu of both folders for every arch here too.
#   2. the signal path: exactly one red.release.sys.global.add.u64 in the PTX of semaphore_signal
#      (and in SASS, when cuobjdump is available: REDG/RED .ADD.64.STRONG.SYS after MEMBAR.SYS)
#   3. the FIFO push publishes with one 128-bit release store (PTX st.release.sys.global.b128);
#      the switch channel's allReduce<f32x4> is one multimem.ld_reduce.v4.f32 + one multimem.st.v4.f32
#      per vector for sm_90 (api_compile_switch)
#   4. tests/api_compile.cu with hipcc for gfx90a (if hipcc is installed; `cargo build --features
#      rocm` compiles the library and test kernels, ALL_ARCHS=1 compiles them here too)
#   5. layout_dump.cpp with the host C++ compiler, run, and checked against the expected layout
# Compiles run in parallel (JOBS, default the number of CPUs).
# Env: NVCC (default /opt/nvcc13/nvidia/cu13/bin/nvcc, then nvcc on PATH), HIPCC (default hipcc),
#      CXX (default g++), CUOBJDUMP (default cuobjdump on PATH), KEEP=dir to keep the outputs.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/.."   # repository root
out="${KEEP:-$(mktemp -d)}"
mkdir -p "$out"
# Without KEEP the outputs go when the script ends (every CI run left a /tmp/tmp.* folder), and
# hipcc's own temporary folders (it leaves empty /tmp/<source>-<hex> ones) are made inside it.
[ -n "${KEEP:-}" ] || trap 'rm -rf "$out"' EXIT
mkdir -p "$out/hip-tmp"
fail=0
note() { printf '%s\n' "$*"; }
bad() { printf 'FAIL: %s\n' "$*"; fail=1; }

nvcc="${NVCC:-/opt/nvcc13/nvidia/cu13/bin/nvcc}"
[ -x "$nvcc" ] || nvcc="$(command -v nvcc || true)"
if [ "${ALL_ARCHS:-0}" = 1 ]; then
  mapfile -t sources < <(find kernels/cuda/src kernels/cuda/test_kernels -name '*.cu' | sort; echo kernels/cuda/tests/api_compile.cu)
else
  sources=(kernels/cuda/test_kernels/fifo_tests.cu kernels/cuda/test_kernels/semaphore_tests.cu kernels/cuda/tests/api_compile.cu)
fi

all_gencode=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
  -gencode arch=compute_100,code=sm_100 -gencode arch=compute_90,code=compute_90)
jobs="${JOBS:-$(nproc)}"
# compile_all TOOL FILE...: runs `compile_one TOOL FILE` for each, $jobs at a time, reports
# in source order.
compile_all() {
  local tool=$1 f i=0 pids=() files=(); shift
  for f in "$@"; do
    compile_one "$tool" "$f" & pids+=($!); files+=("$f")
    if [ ${#pids[@]} -ge "$jobs" ]; then wait_some; fi
  done
  wait_some all
}
wait_some() { # waits for the oldest job (every job with `all`), printing its result
  while [ ${#pids[@]} -gt 0 ]; do
    if wait "${pids[0]}"; then note "ok   $tool ${files[0]}"; else bad "$tool ${files[0]}"; cat "$out/$(stem_of "${files[0]}").$tool.log"; fi
    pids=("${pids[@]:1}"); files=("${files[@]:1}")
    [ "${1:-}" = all ] || break
  done
}
stem_of() { echo "${1%.cu}" | sed 's#^kernels/cuda/##; s#/#__#g'; }
compile_one() {
  local tool=$1 f=$2 stem; stem="$(stem_of "$f")"
  if [ "$tool" = nvcc ]; then
    "$nvcc" -std=c++17 -O3 -I kernels/cuda/include -fatbin "${all_gencode[@]}" "$f" -o "$out/$stem.fatbin" >"$out/$stem.nvcc.log" 2>&1
  else
    TMPDIR="$out/hip-tmp" HIP_PLATFORM=amd "$hipcc" -x hip --offload-arch=gfx90a --genco -I kernels/hip/include -I kernels/cuda/include \
      "$f" -o "$out/$stem.hsaco" >"$out/$stem.hipcc.log" 2>&1
  fi
}

if [ -n "$nvcc" ]; then
  compile_all nvcc "${sources[@]}"

  "$nvcc" -std=c++17 -O3 -I kernels/cuda/include -ptx -arch=sm_90 kernels/cuda/test_kernels/semaphore_tests.cu -o "$out/semaphore_tests.ptx"
  # PTX of semaphore_signal only: one thread, one signal().
  n_red="$(awk '/\.entry semaphore_signal\(/,/^}/' "$out/semaphore_tests.ptx" | grep -c 'red.release.sys.global.add.u64' || true)"
  if [ "$n_red" = "1" ]; then note "ok   signal(): one red.release.sys.global.add.u64 in semaphore_signal"; else bad "signal(): expected 1 red.release in semaphore_signal, found $n_red"; fi
  n_other="$(awk '/\.entry semaphore_signal\(/,/^}/' "$out/semaphore_tests.ptx" | grep -cE 'atom\.|st\.release|membar|fence' || true)"
  if [ "$n_other" = "0" ]; then note "ok   signal(): no other atomic, store or fence"; else bad "signal(): found $n_other extra atomics/fences"; fi

  "$nvcc" -std=c++17 -O3 -I kernels/cuda/include -ptx -arch=sm_90 kernels/cuda/test_kernels/fifo_tests.cu -o "$out/fifo_tests.ptx"
  n_st="$(awk '/\.entry fifo_push_perf/,/^}/' "$out/fifo_tests.ptx" | grep -c 'st.release.sys.global.b128' || true)"
  if [ "$n_st" -ge 1 ]; then note "ok   fifo push: st.release.sys.global.b128"; else bad "fifo push: no st.release.sys.global.b128"; fi

  "$nvcc" -std=c++17 -O3 -I kernels/cuda/include -ptx -arch=sm_90 kernels/cuda/tests/api_compile.cu -o "$out/api_compile.ptx"
  sw="$(awk '/\.entry api_compile_switch\(/,/^}/' "$out/api_compile.ptx")"
  n_ldred="$(echo "$sw" | grep -c 'multimem.ld_reduce.relaxed.sys.global.add.v4.f32' || true)"
  n_mst="$(echo "$sw" | grep -c 'multimem.st.relaxed.sys.global.v4.f32' || true)"
  if [ "$n_ldred" = "2" ] && [ "$n_mst" = "2" ]; then note "ok   switch channel: multimem.ld_reduce/st .v4.f32 (reduce + allReduce)"; else bad "switch channel: expected 2 multimem.ld_reduce.v4.f32 and 2 multimem.st.v4.f32 in api_compile_switch, found $n_ldred and $n_mst"; fi
  n_trap="$(echo "$sw" | grep -c 'trap' || true)"
  if [ "$n_trap" = "0" ]; then note "ok   switch channel: no trap on sm_90"; else bad "switch channel: sm_90 build traps"; fi

  cuobjdump="${CUOBJDUMP:-$(command -v cuobjdump || true)}"
  if [ -n "$cuobjdump" ] && "$cuobjdump" --dump-sass "$out/test_kernels__semaphore_tests.fatbin" >"$out/semaphore_tests.sass" 2>/dev/null; then
    n_sass="$(awk '/Function : semaphore_signal$/{p=1;next} /Function :/{p=0} p' "$out/semaphore_tests.sass" | grep -cE 'RED(G)?\.E\.ADD\.64\.STRONG\.SYS' || true)"
    n_atom="$(awk '/Function : semaphore_signal$/{p=1;next} /Function :/{p=0} p' "$out/semaphore_tests.sass" | grep -cE 'ATOM' || true)"
    n_arch="$(grep -c 'Function : semaphore_signal$' "$out/semaphore_tests.sass" || true)"
    if [ "$n_sass" = "$n_arch" ] && [ "$n_atom" = "0" ]; then note "ok   SASS: signal is one RED.ADD.64.STRONG.SYS per arch ($n_arch archs), no returning ATOM"; else bad "SASS: RED count $n_sass over $n_arch archs, ATOM count $n_atom"; fi
  else
    note "skip SASS check (cuobjdump with nvdisasm not found)"
  fi
else
  note "skip nvcc checks (nvcc not found)"
fi

hipcc="${HIPCC:-$(command -v hipcc || true)}"
if [ -n "$hipcc" ]; then
  if [ "${ALL_ARCHS:-0}" = 1 ]; then compile_all hipcc "${sources[@]}"; else compile_all hipcc kernels/cuda/tests/api_compile.cu; fi
else
  note "skip hipcc checks (hipcc not found)"
fi

cxx="${CXX:-g++}"
"$cxx" -std=c++17 -Wall -Wextra -Werror -I kernels/cuda/include kernels/cuda/tests/layout_dump.cpp -o "$out/layout_dump"
"$out/layout_dump" >"$out/layout.txt"
expect=(
  "ProxyTrigger size 16" "ProxyTrigger align 16" "ProxyTrigger.snd offset 8"
  "FifoDeviceHandle size 40" "FifoDeviceHandle.tailCache offset 24" "FifoDeviceHandle.size offset 32"
  "Host2DeviceSemaphoreDeviceHandle size 16" "MemoryDevice2DeviceSemaphoreDeviceHandle size 24"
  "MemoryChannelDeviceHandle size 48" "MemoryChannelDeviceHandle.dst offset 24"
  "MemoryChannelDeviceHandle.src offset 32" "MemoryChannelDeviceHandle.packetBuffer offset 40"
  "BasePortChannelDeviceHandle size 64" "BasePortChannelDeviceHandle.semaphore offset 8"
  "BasePortChannelDeviceHandle.fifo offset 24" "PortChannelDeviceHandle size 72"
  "PortChannelDeviceHandle.dst offset 64" "PortChannelDeviceHandle.src offset 68"
  "LL16Packet size 16" "LL8Packet size 8"
  "SwitchChannelDeviceHandle size 24" "SwitchChannelDeviceHandle.mcPtr offset 8"
  "SwitchChannelDeviceHandle.bufferSize offset 16" "f32x4 size 16" "f16x8 size 16" "bf16x8 size 16"
  "trigger_example data_flag fst 0x0000200000000400 snd 0x00ec0a0300001000"
)
for line in "${expect[@]}"; do
  grep -qxF "$line" "$out/layout.txt" || bad "layout: missing '$line'"
done
[ "$fail" = 0 ] && note "ok   layout_dump ($(wc -l <"$out/layout.txt") lines)"

where="outputs in $out"; [ -n "${KEEP:-}" ] || where="KEEP=dir keeps the outputs"
if [ "$fail" = 0 ]; then note "all device-code checks passed ($where)"; else note "device-code checks FAILED ($where)"; exit 1; fi
