// What the standalone breakdowns (fifo_breakdown.cu, signal_breakdown.cu) share: the CUDA
// runtime check and the device's %globaltimer.
#ifndef MSCCLPP_TESTS_BREAKDOWN_UTIL_HPP_
#define MSCCLPP_TESTS_BREAKDOWN_UTIL_HPP_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

/// Exits with status 2 and the failing call when a CUDA runtime call fails.
#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

/// Nanoseconds of the device's global timer.
__device__ __forceinline__ uint64_t globalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

#endif  // MSCCLPP_TESTS_BREAKDOWN_UTIL_HPP_
