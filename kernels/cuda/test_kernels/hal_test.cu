// HAL self-test kernels: fill and check a u32 pattern through any device pointer
// (used by hal/tests and the hal_ipc_check example to write through imported IPC memory).
#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#endif
#include <stdint.h>

__device__ __forceinline__ uint32_t hal_pattern(uint64_t i, uint32_t seed) {
  return seed ^ (uint32_t)(i * 2654435761ull);
}

// dst[i] = seed ^ (i * 2654435761) for every i < n.
extern "C" __global__ void hal_fill_u32(uint32_t* dst, uint64_t n, uint32_t seed) {
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = hal_pattern(i, seed);
  }
}

// Counts elements of src that differ from the fill pattern into *mismatches.
extern "C" __global__ void hal_check_u32(const uint32_t* src, uint64_t n, uint32_t seed,
                                         unsigned long long* mismatches) {
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (src[i] != hal_pattern(i, seed)) atomicAdd(mismatches, 1ull);
  }
}

// Waits until *flag >= value or max_cycles SM clock cycles have passed; *result = 1 when it saw
// the value, 2 when it gave up (hal/tests/gpu_sync_copies.rs: the host's synchronous copies must
// land while a kernel runs and the legacy default stream waits for it).
extern "C" __global__ void hal_wait_u64(const volatile unsigned long long* flag, unsigned long long value,
                                        long long max_cycles, unsigned long long* result) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const long long t0 = clock64();
  while (*flag < value) {
    if (clock64() - t0 > max_cycles) {
      *result = 2ull;
      return;
    }
  }
  *result = 1ull;
}
