// The executor kernel for launches of up to 256 threads per block (code object
// "executor/executor_narrow"): the same body as executor.cu's (executor_body.cuh), compiled
// for 256 threads, so the compiler may give each thread up to 255 registers where the
// 1024-thread kernel has 64 and spills (sm_90, `ptxas -v`: 3218 bytes of spill stores over the
// kernel and its calls at 1024 threads, 476 at 256). The host launches it, with
// MSCCLPP_EXECUTOR_KERNEL=narrow, whenever the launch's threads fit (by default the prefetch
// build, executor_prefetch.cu, runs there).
// On ROCm the ops stay out-of-line functions, as here (hal/kernel-build: FUNCTION_CALLS_MARKER).
// mscclpp-kernel-build: amdgpu-function-calls
#include "executor_body.cuh"

extern "C" __global__ void __launch_bounds__(256) executor_kernel_narrow(ExecArgs args) { executorRun(args); }
