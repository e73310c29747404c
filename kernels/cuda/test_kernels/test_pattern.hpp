// Test data and helpers shared by the test kernels (not compiled on its own: build.rs compiles *.cu
// only).
//
// testPattern(seed, round, i): the u32 that element i of a buffer holds in round `round`:
//   x = (uint32_t)seed ^ (uint32_t)(seed >> 32) ^ (round * 0x9E3779B9u) ^ (i * 0x85EBCA6Bu)   (u32 wrap)
//   x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
// (i is the element index truncated to u32.) The Rust side mirrors it to check buffers on the host.
#ifndef MSCCLPP_TEST_PATTERN_HPP_
#define MSCCLPP_TEST_PATTERN_HPP_

#include <mscclpp/device.hpp>

MSCCLPP_HOST_DEVICE_INLINE uint32_t testPattern(uint64_t seed, uint32_t round, uint64_t i) {
  uint32_t x = (uint32_t)seed ^ (uint32_t)(seed >> 32) ^ (round * 0x9E3779B9u) ^ ((uint32_t)i * 0x85EBCA6Bu);
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

#if defined(MSCCLPP_DEVICE_COMPILE)
/// Fill buff[0..nElem) with round `round`'s pattern; all threads of the block.
__device__ inline void fillPattern(uint32_t* buff, uint64_t nElem, uint64_t seed, uint32_t round) {
  for (uint64_t i = threadIdx.x; i < nElem; i += blockDim.x) buff[i] = testPattern(seed, round, i);
}

/// Count mismatches of buff against round `round`'s pattern into *errorCount; all threads of the block.
__device__ inline void checkPattern(const uint32_t* buff, uint64_t nElem, uint64_t seed, uint32_t round,
                                    int* errorCount) {
  int errors = 0;
  for (uint64_t i = threadIdx.x; i < nElem; i += blockDim.x) {
    if (buff[i] != testPattern(seed, round, i)) ++errors;
  }
  if (errors) atomicAdd(errorCount, errors);
}

/// Waits for the peer's signal on `h` (a semaphore or channel handle): spins on poll() when
/// `usePoll` (a device check naming `what` fails after MSCCLPP_DEFAULT_MAX_SPIN spins), else wait().
template <typename Handle>
__device__ inline void waitOrPoll(Handle& h, int usePoll, const char* what) {
  if (usePoll) {
    int64_t spins = 0;
    while (!h.poll()) {
      MSCCLPP_DEVICE_CHECK(++spins < MSCCLPP_DEFAULT_MAX_SPIN, what);
    }
  } else {
    h.wait();
  }
}
#endif

#endif  // MSCCLPP_TEST_PATTERN_HPP_
