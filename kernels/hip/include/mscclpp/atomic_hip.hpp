// HIP (AMD) implementations of the memory operations listed in mscclpp/atomic_device.hpp.
// Included only by atomic_device.hpp under MSCCLPP_DEVICE_HIP; needs both include folders:
//   hipcc -x hip -I kernels/hip/include -I kernels/cuda/include
// Every operation is a clang __hip_atomic_* builtin with an explicit order and scope, so the same
// ordering arguments as the PTX side hold under the HIP memory model.
#ifndef MSCCLPP_ATOMIC_HIP_HPP_
#define MSCCLPP_ATOMIC_HIP_HPP_

#include <mscclpp/device.hpp>

namespace mscclpp {

MSCCLPP_DEVICE_INLINE uint64_t loadAcquireSys(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}

MSCCLPP_DEVICE_INLINE uint64_t loadRelaxedSys(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}

MSCCLPP_DEVICE_INLINE void storeReleaseSys(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}

MSCCLPP_DEVICE_INLINE void storeRelaxedSys(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}

/// The result is discarded, so the compiler emits a fire-and-forget atomic (no return).
MSCCLPP_DEVICE_INLINE void redAddReleaseSys(uint64_t* p, uint64_t v) {
  (void)__hip_atomic_fetch_add(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}

MSCCLPP_DEVICE_INLINE void redAddRelaxedSys(uint64_t* p, uint64_t v) {
  (void)__hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}

MSCCLPP_DEVICE_INLINE uint64_t fetchAddRelaxedGpu(uint64_t* p, uint64_t v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

MSCCLPP_DEVICE_INLINE void maxRelaxedGpu(uint64_t* p, uint64_t v) {
  (void)__hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

/// HIP has no 128-bit atomic store: the low word is stored relaxed, then the high word (which holds
/// the FIFO commit bit) with release, so a reader that acquires the high word sees the low word.
MSCCLPP_DEVICE_INLINE void store128ReleaseSys(uint64_t* p, uint64_t lo, uint64_t hi) {
  storeRelaxedSys(p, lo);
  storeReleaseSys(p + 1, hi);
}

/// Two single-copy-atomic u64 halves (each LL16 half carries its own flag).
MSCCLPP_DEVICE_INLINE void store128RelaxedSys(uint64_t* p, uint64_t lo, uint64_t hi) {
  storeRelaxedSys(p, lo);
  storeRelaxedSys(p + 1, hi);
}

MSCCLPP_DEVICE_INLINE void load128RelaxedSys(const uint64_t* p, uint64_t& lo, uint64_t& hi) {
  lo = loadRelaxedSys(p);
  hi = loadRelaxedSys(p + 1);
}

MSCCLPP_DEVICE_INLINE void store64RelaxedSys(uint64_t* p, uint64_t v) { storeRelaxedSys(p, v); }

MSCCLPP_DEVICE_INLINE uint64_t load64RelaxedSys(const uint64_t* p) { return loadRelaxedSys(p); }

}  // namespace mscclpp

#endif  // MSCCLPP_ATOMIC_HIP_HPP_
