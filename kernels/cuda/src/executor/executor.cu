// The executor kernel for launches of up to 1024 threads per block (code object
// "executor/executor"); its body and what it does: executor_body.cuh. The host takes
// executor_narrow.cu's kernel instead whenever a launch has at most 256 threads per block.
// On ROCm the ops stay out-of-line functions, as here (hal/kernel-build: FUNCTION_CALLS_MARKER).
// mscclpp-kernel-build: amdgpu-function-calls
#include "executor_body.cuh"

extern "C" __global__ void __launch_bounds__(1024) executor_kernel(ExecArgs args) { executorRun(args); }
