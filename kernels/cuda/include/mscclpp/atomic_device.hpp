// The memory operations the device API is built from, each with an explicit order and scope.
// CUDA: inline PTX written here. HIP: <mscclpp/atomic_hip.hpp> from kernels/hip/include.
//
//   loadAcquireSys / loadRelaxedSys (u64)         ld.{acquire,relaxed}.sys.global.u64
//   storeReleaseSys / storeRelaxedSys (u64)       st.{release,relaxed}.sys.global.u64
//   redAddReleaseSys / redAddRelaxedSys (u64)     red.{release,relaxed}.sys.global.add.u64 (no return)
//   fetchAddRelaxedGpu (u64)                      atom.relaxed.gpu.global.add.u64 (returns old)
//   maxRelaxedGpu (u64)                           atom.relaxed.gpu.global.max.u64 (result unused)
//   store128ReleaseSys(p, lo, hi)                 see fifo_device.hpp for why this exists
//   store128RelaxedSys / load128RelaxedSys        LL16 packets (two u64 halves, each single-copy atomic)
//   store64RelaxedSys / load64RelaxedSys          LL8 packets
#ifndef MSCCLPP_ATOMIC_DEVICE_HPP_
#define MSCCLPP_ATOMIC_DEVICE_HPP_

#include "device.hpp"

#if defined(MSCCLPP_DEVICE_HIP)
#include <mscclpp/atomic_hip.hpp>
#elif defined(MSCCLPP_DEVICE_CUDA)

// PTX ISA 8.3 (CUDA 12.3) added the .b128 type to ld/st (sm_70 and newer).
#if (__CUDACC_VER_MAJOR__ > 12) || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 3)
#define MSCCLPP_HAS_B128_STORE 1
#else
#define MSCCLPP_HAS_B128_STORE 0
#endif

namespace mscclpp {

MSCCLPP_DEVICE_INLINE uint64_t loadAcquireSys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

MSCCLPP_DEVICE_INLINE uint64_t loadRelaxedSys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

MSCCLPP_DEVICE_INLINE void storeReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

MSCCLPP_DEVICE_INLINE void storeRelaxedSys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

MSCCLPP_DEVICE_INLINE void redAddReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

MSCCLPP_DEVICE_INLINE void redAddRelaxedSys(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

MSCCLPP_DEVICE_INLINE uint64_t fetchAddRelaxedGpu(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.relaxed.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

MSCCLPP_DEVICE_INLINE void maxRelaxedGpu(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.gpu.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/// One 16-byte release store at system scope (lo at p[0], hi at p[1]); p must be 16-byte aligned.
MSCCLPP_DEVICE_INLINE void store128ReleaseSys(uint64_t* p, uint64_t lo, uint64_t hi) {
#if MSCCLPP_HAS_B128_STORE && (__CUDA_ARCH__ >= 700 || !defined(__CUDA_ARCH__))
  asm volatile(
      "{\n\t.reg .b128 mscclpp_t;\n\tmov.b128 mscclpp_t, {%1, %2};\n\tst.release.sys.global.b128 [%0], mscclpp_t;\n\t}" ::"l"(p),
      "l"(lo), "l"(hi)
      : "memory");
#else
  storeRelaxedSys(p, lo);
  storeReleaseSys(p + 1, hi);
#endif
}

/// 16-byte relaxed system-scope store as two u64 elements of one vector instruction.
MSCCLPP_DEVICE_INLINE void store128RelaxedSys(uint64_t* p, uint64_t lo, uint64_t hi) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}

MSCCLPP_DEVICE_INLINE void load128RelaxedSys(const uint64_t* p, uint64_t& lo, uint64_t& hi) {
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(p) : "memory");
}

MSCCLPP_DEVICE_INLINE void store64RelaxedSys(uint64_t* p, uint64_t v) { storeRelaxedSys(p, v); }

MSCCLPP_DEVICE_INLINE uint64_t load64RelaxedSys(const uint64_t* p) { return loadRelaxedSys(p); }

}  // namespace mscclpp

#endif  // MSCCLPP_DEVICE_CUDA

#endif  // MSCCLPP_ATOMIC_DEVICE_HPP_
