// What the standalone breakdowns and bandwidth tools (fifo_breakdown.cu, signal_breakdown.cu,
// packet_bw.cu, copy_bw.cu) share: the CUDA runtime check, the device's %globaltimer and the
// time per back-to-back launch.
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

/// Microseconds per call of `launch` (which enqueues on `s`): `warm` calls, then `iters` calls
/// between two events, their elapsed time divided by `iters`.
template <typename F>
inline float usPerLaunch(cudaStream_t s, int warm, int iters, F launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) launch();
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) launch();
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms * 1000.f / iters;
}

#endif  // MSCCLPP_TESTS_BREAKDOWN_UTIL_HPP_
