// The executor kernel's prefetch build (code object "executor/executor_prefetch"): the narrow
// build (executor_narrow.cu, up to 256 threads per block) whose reductions load the next
// input while they combine one (kPrefetch in executor_body.cuh). The default for launches of
// up to 256 threads since round 13 (H100: 3-9 % faster at 16 MiB for the reducing plans,
// docs/executor.md; MSCCLPP_EXECUTOR_KERNEL=narrow takes executor_narrow.cu instead).
// `ptxas -v` for sm_90: its reductions' vectors in registers and 0.6 KB of spill stores over
// the interpreter (the narrow build: 0.5 KB).
// On ROCm the ops stay out-of-line functions, as here (hal/kernel-build: FUNCTION_CALLS_MARKER).
// mscclpp-kernel-build: amdgpu-function-calls
#define MSCCLPP_EXECUTOR_PREFETCH 1
#include "executor_body.cuh"

extern "C" __global__ void __launch_bounds__(256) executor_kernel_prefetch(ExecArgs args) { executorRun(args); }
