// Vendor selection for mscclpp device code: one source compiles with nvcc (CUDA), hipcc (HIP) and,
// for the struct definitions only, a plain host C++17 compiler.
//
// Macros defined here:
//   MSCCLPP_DEVICE_COMPILE      defined under nvcc or hipcc; device functions exist only then
//   MSCCLPP_DEVICE_CUDA         nvcc (NVIDIA); inline PTX is used
//   MSCCLPP_DEVICE_HIP          hipcc / clang -x hip (AMD); __hip_atomic_* builtins are used
//   MSCCLPP_DEVICE_INLINE       force-inlined device function
//   MSCCLPP_HOST_DEVICE_INLINE  force-inlined host+device function (plain `inline` on host compilers)
//   MSCCLPP_DEVICE_CHECKS       1 = spin bounds and argument checks are compiled in (default unless
//                               NDEBUG or MSCCLPP_NO_DEVICE_CHECKS is defined), 0 = compiled out
//   MSCCLPP_DEFAULT_MAX_SPIN    spin bound used when a wait is given a negative maxSpin
//                               (default 100'000'000 polls: tens of seconds on H100/H200)
//   MSCCLPP_SPIN_UNTIL(cond, maxSpin, what)  poll until `cond` holds; with checks on, print a message
//                               naming `what`, file, line, block and thread, then trap, once
//                               `maxSpin` polls (or the default bound if negative) went by.
//                               Every MSCCLPP_ABORT_POLL_SPINS polls it also reads the abort
//                               word and, once the host raised it (a peer died, the communicator
//                               was aborted), leaves the wait with `cond` still false (no trap:
//                               that would end the context for every process sharing it)
//   MSCCLPP_ABORT_POLL_SPINS    spins between two reads of the abort word (1024)
//
// The abort word: `mscclppAbortWord`, a device global every module including this header
// defines; the HAL writes the address of the process's abort word (pinned host memory mapped
// for the device) into it when it loads the module (null: never aborts). `abortRaised()` reads
// it, `pollAbort(polls)` reads it every MSCCLPP_ABORT_POLL_SPINS-th call (hand-written wait
// loops use these); the host side is `mscclpp_hal::abort`.
#ifndef MSCCLPP_DEVICE_HPP_
#define MSCCLPP_DEVICE_HPP_

#if defined(__CUDACC_RTC__)
// NVRTC (the executor's plans compiled at load time, core/src/executor/run/jit.rs) has no C
// library headers: the fixed-width types come from libcu++ instead.
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
using cuda::std::int16_t;
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::int8_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::uint8_t;
using cuda::std::uintptr_t;
#else
#include <stdint.h>
#endif

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
#define MSCCLPP_DEVICE_COMPILE 1
#define MSCCLPP_DEVICE_HIP 1
#include <hip/hip_runtime.h>
#elif defined(__CUDACC__)
#define MSCCLPP_DEVICE_COMPILE 1
#define MSCCLPP_DEVICE_CUDA 1
#endif

#if defined(MSCCLPP_DEVICE_COMPILE) && !defined(__CUDACC_RTC__)
#include <stdio.h>
#endif
#if defined(MSCCLPP_DEVICE_COMPILE)
#define MSCCLPP_DEVICE_INLINE __forceinline__ __device__
#define MSCCLPP_HOST_DEVICE_INLINE __forceinline__ __host__ __device__
#else
#define MSCCLPP_DEVICE_INLINE inline
#define MSCCLPP_HOST_DEVICE_INLINE inline
#endif

#if !defined(MSCCLPP_DEVICE_CHECKS)
#if defined(NDEBUG) || defined(MSCCLPP_NO_DEVICE_CHECKS)
#define MSCCLPP_DEVICE_CHECKS 0
#else
#define MSCCLPP_DEVICE_CHECKS 1
#endif
#endif

#if !defined(MSCCLPP_DEFAULT_MAX_SPIN)
#define MSCCLPP_DEFAULT_MAX_SPIN 100000000LL
#endif

#if !defined(MSCCLPP_ABORT_POLL_SPINS)
#define MSCCLPP_ABORT_POLL_SPINS 1024
#endif

#if defined(MSCCLPP_DEVICE_COMPILE)
/// The process's abort word (set by the HAL at module load; null until then). One per module:
/// every translation unit is its own module, so a plain definition in the header is one
/// definition per module.
__device__ volatile int* mscclppAbortWord = nullptr;

namespace mscclpp {

/// Whether the host raised the abort word (a peer died or the communicator was aborted): a
/// wait that cannot finish any more should be left.
MSCCLPP_DEVICE_INLINE bool abortRaised() {
#if defined(MSCCLPP_DEVICE_HIP)
  // A system-scope atomic load of the mapped host word.
  int* w = const_cast<int*>(mscclppAbortWord);
  return w != nullptr && __hip_atomic_load(w, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM) != 0;
#else
  volatile int* w = mscclppAbortWord;
  return w != nullptr && *w != 0;
#endif
}

/// `abortRaised()` on every MSCCLPP_ABORT_POLL_SPINS-th call (`polls` counts the caller's
/// spins), false on the others: the word is host memory, too slow to read on every spin.
MSCCLPP_DEVICE_INLINE bool pollAbort(int64_t polls) {
  return (polls % MSCCLPP_ABORT_POLL_SPINS) == (MSCCLPP_ABORT_POLL_SPINS - 1) && abortRaised();
}

namespace detail {

/// Ends the kernel after a failed device check. Kept out of line so the polling loops stay small.
#if defined(MSCCLPP_DEVICE_CUDA)
__device__ __noinline__ inline void deviceCheckFailed(const char* what, const char* file, int line) {
#else
// hipcc (clang 15) inlined the `__noinline__ inline` form, device printf and all, into every
// polling loop: ~6 s of compile per kernel instance (a port-channel all-reduce file took 10
// minutes). A static noinline function stays one call target per translation unit.
static __device__ __attribute__((noinline, unused)) void deviceCheckFailed(const char* what, const char* file,
                                                                          int line) {
#endif
  printf("mscclpp device check failed: %s at %s:%d (block %d,%d,%d thread %d,%d,%d)\n", what, file, line,
         (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)threadIdx.x, (int)threadIdx.y, (int)threadIdx.z);
#if defined(MSCCLPP_DEVICE_CUDA)
  __trap();
#else
  // Not __builtin_trap(): its `unreachable` in a wait loop that also leaves on the abort word
  // crashes Debian's hipcc (clang 15: "failed to annotate CFG"). The same trap as inline asm,
  // then the end of the wave should the trap handler return.
  asm volatile("s_trap 2\n\ts_endpgm");
#endif
}

}  // namespace detail
}  // namespace mscclpp

/// Poll until `cond` is true. See the file comment for the bound.
#define MSCCLPP_SPIN_UNTIL(cond, maxSpin, what)                                                    \
  do {                                                                                             \
    const int64_t mscclppSpinLimit_ = ((maxSpin) < 0) ? (int64_t)MSCCLPP_DEFAULT_MAX_SPIN : (maxSpin); \
    int64_t mscclppSpins_ = 0;                                                                     \
    (void)mscclppSpinLimit_;                                                                       \
    (void)mscclppSpins_;                                                                           \
    int64_t mscclppAbortPolls_ = 0;                                                                \
    while (!(cond)) {                                                                              \
      if (::mscclpp::pollAbort(mscclppAbortPolls_++)) break;                                       \
      if (MSCCLPP_DEVICE_CHECKS && mscclppSpins_++ >= mscclppSpinLimit_) {                          \
        ::mscclpp::detail::deviceCheckFailed("spin bound exceeded waiting for " what, __FILE__, __LINE__); \
      }                                                                                            \
    }                                                                                              \
  } while (0)

/// Check a precondition of a device API call when checks are compiled in.
#define MSCCLPP_DEVICE_CHECK(cond, what)                                         \
  do {                                                                           \
    if (MSCCLPP_DEVICE_CHECKS && !(cond)) {                                      \
      ::mscclpp::detail::deviceCheckFailed(what, __FILE__, __LINE__);            \
    }                                                                            \
  } while (0)

#endif  // defined(MSCCLPP_DEVICE_COMPILE)

#endif  // MSCCLPP_DEVICE_HPP_
