// Switch channel (NVLink SHARP / NVLS) device API: a buffer bound to a multicast object, reached
// through its multicast address.
//
//   multimemLoadReduce<V>(mc)   one `multimem.ld_reduce.relaxed.sys.global.add` of vector V: the
//                               sum of every device's copy at that offset, reduced in the switch
//   multimemStore<V>(v, mc)     one `multimem.st.relaxed.sys.global`: v written into every copy
//   SwitchChannelDeviceHandle   {devicePtr (own copy), mcPtr (multicast address), bufferSize}
//     reduce<V>(i), broadcast<V>(i, v)        vector i of the buffer, as above
//     allReduce<V>(first, n, tid, nthreads)   vectors [first, first + n) become their sum on every
//                                             device (load-reduce then store), strided over threads
//
// Vectors: f32x1/x2/x4, f16x2/x4/x8, bf16x2/x4/x8, i32x1, u32x1 (MultimemVector<Tag, Words>: 32-bit
// words; the 16-byte ones are f32x4, f16x8, bf16x8). The multimem instructions exist on sm_90 and
// newer only: compiled for an older architecture the operations fail a device check (trap) instead
// of emitting them; under HIP only the struct exists. Relaxed, system scope: order them with the
// other ranks' work through semaphores. The struct layout is mirrored in core/src/switch_channel.rs.
#ifndef MSCCLPP_SWITCH_CHANNEL_DEVICE_HPP_
#define MSCCLPP_SWITCH_CHANNEL_DEVICE_HPP_

#include <type_traits>

#include "device.hpp"

namespace mscclpp {

/// Element tags of multimem vectors (no fp16 headers needed on host compilers).
struct MultimemF32 {};
struct MultimemF16 {};
struct MultimemBF16 {};
struct MultimemI32 {};
struct MultimemU32 {};

/// `Words` 32-bit words holding elements of kind `Tag` (two f16/bf16 per word).
template <typename Tag, int Words>
struct alignas(4 * Words) MultimemVector {
  uint32_t words[Words];
};

using f32x1 = MultimemVector<MultimemF32, 1>;
using f32x2 = MultimemVector<MultimemF32, 2>;
using f32x4 = MultimemVector<MultimemF32, 4>;
using f16x2 = MultimemVector<MultimemF16, 1>;
using f16x4 = MultimemVector<MultimemF16, 2>;
using f16x8 = MultimemVector<MultimemF16, 4>;
using bf16x2 = MultimemVector<MultimemBF16, 1>;
using bf16x4 = MultimemVector<MultimemBF16, 2>;
using bf16x8 = MultimemVector<MultimemBF16, 4>;
using i32x1 = MultimemVector<MultimemI32, 1>;
using u32x1 = MultimemVector<MultimemU32, 1>;

#if defined(MSCCLPP_DEVICE_CUDA)

namespace detail {

template <typename>
constexpr bool multimemUnsupported = false;

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define MSCCLPP_MULTIMEM_AVAILABLE 1
#endif

// One instruction per vector width (1, 2 or 4 32-bit registers); `ty` is the PTX element type.
#define MSCCLPP_MM_LDRED1(ty)                                                                              \
  asm volatile("multimem.ld_reduce.relaxed.sys.global.add." ty " %0, [%1];" : "=r"(v.words[0]) : "l"(p) : "memory")
#define MSCCLPP_MM_LDRED2(ty)                                                                              \
  asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v2." ty " {%0, %1}, [%2];"                      \
               : "=r"(v.words[0]), "=r"(v.words[1])                                                       \
               : "l"(p)                                                                                   \
               : "memory")
#define MSCCLPP_MM_LDRED4(ty)                                                                              \
  asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v4." ty " {%0, %1, %2, %3}, [%4];"              \
               : "=r"(v.words[0]), "=r"(v.words[1]), "=r"(v.words[2]), "=r"(v.words[3])                   \
               : "l"(p)                                                                                   \
               : "memory")
#define MSCCLPP_MM_ST1(ty) asm volatile("multimem.st.relaxed.sys.global." ty " [%0], %1;" ::"l"(p), "r"(v.words[0]) : "memory")
#define MSCCLPP_MM_ST2(ty)                                                                              \
  asm volatile("multimem.st.relaxed.sys.global.v2." ty " [%0], {%1, %2};" ::"l"(p), "r"(v.words[0]),     \
               "r"(v.words[1])                                                                          \
               : "memory")
#define MSCCLPP_MM_ST4(ty)                                                                              \
  asm volatile("multimem.st.relaxed.sys.global.v4." ty " [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.words[0]), \
               "r"(v.words[1]), "r"(v.words[2]), "r"(v.words[3])                                        \
               : "memory")

}  // namespace detail

/// The sum over every device of the vector at multicast address `p` (see the file comment).
template <typename Tag, int Words>
MSCCLPP_DEVICE_INLINE MultimemVector<Tag, Words> multimemLoadReduce(const MultimemVector<Tag, Words>* p) {
  MultimemVector<Tag, Words> v{};
#if defined(MSCCLPP_MULTIMEM_AVAILABLE)
  if constexpr (std::is_same_v<Tag, MultimemF32>) {
    if constexpr (Words == 1) MSCCLPP_MM_LDRED1("f32");
    else if constexpr (Words == 2) MSCCLPP_MM_LDRED2("f32");
    else if constexpr (Words == 4) MSCCLPP_MM_LDRED4("f32");
    else static_assert(detail::multimemUnsupported<Tag>, "f32 vectors have 1, 2 or 4 words");
  } else if constexpr (std::is_same_v<Tag, MultimemF16>) {
    if constexpr (Words == 1) MSCCLPP_MM_LDRED1("f16x2");
    else if constexpr (Words == 2) MSCCLPP_MM_LDRED2("f16x2");
    else if constexpr (Words == 4) MSCCLPP_MM_LDRED4("f16x2");
    else static_assert(detail::multimemUnsupported<Tag>, "f16 vectors have 1, 2 or 4 words");
  } else if constexpr (std::is_same_v<Tag, MultimemBF16>) {
    if constexpr (Words == 1) MSCCLPP_MM_LDRED1("bf16x2");
    else if constexpr (Words == 2) MSCCLPP_MM_LDRED2("bf16x2");
    else if constexpr (Words == 4) MSCCLPP_MM_LDRED4("bf16x2");
    else static_assert(detail::multimemUnsupported<Tag>, "bf16 vectors have 1, 2 or 4 words");
  } else if constexpr (std::is_same_v<Tag, MultimemI32> && Words == 1) {
    MSCCLPP_MM_LDRED1("s32");
  } else if constexpr (std::is_same_v<Tag, MultimemU32> && Words == 1) {
    MSCCLPP_MM_LDRED1("u32");
  } else {
    static_assert(detail::multimemUnsupported<Tag>, "unsupported multimem vector");
  }
#else
  (void)p;
  MSCCLPP_DEVICE_CHECK(false, "multimemLoadReduce needs sm_90 or newer");
#endif
  return v;
}

/// Writes `v` into every device's copy at multicast address `p` (see the file comment).
template <typename Tag, int Words>
MSCCLPP_DEVICE_INLINE void multimemStore(const MultimemVector<Tag, Words>& v, MultimemVector<Tag, Words>* p) {
#if defined(MSCCLPP_MULTIMEM_AVAILABLE)
  if constexpr (std::is_same_v<Tag, MultimemF32>) {
    if constexpr (Words == 1) MSCCLPP_MM_ST1("f32");
    else if constexpr (Words == 2) MSCCLPP_MM_ST2("f32");
    else if constexpr (Words == 4) MSCCLPP_MM_ST4("f32");
    else static_assert(detail::multimemUnsupported<Tag>, "f32 vectors have 1, 2 or 4 words");
  } else if constexpr (std::is_same_v<Tag, MultimemF16>) {
    if constexpr (Words == 1) MSCCLPP_MM_ST1("f16x2");
    else if constexpr (Words == 2) MSCCLPP_MM_ST2("f16x2");
    else if constexpr (Words == 4) MSCCLPP_MM_ST4("f16x2");
    else static_assert(detail::multimemUnsupported<Tag>, "f16 vectors have 1, 2 or 4 words");
  } else if constexpr (std::is_same_v<Tag, MultimemBF16>) {
    if constexpr (Words == 1) MSCCLPP_MM_ST1("bf16x2");
    else if constexpr (Words == 2) MSCCLPP_MM_ST2("bf16x2");
    else if constexpr (Words == 4) MSCCLPP_MM_ST4("bf16x2");
    else static_assert(detail::multimemUnsupported<Tag>, "bf16 vectors have 1, 2 or 4 words");
  } else if constexpr (std::is_same_v<Tag, MultimemI32> && Words == 1) {
    MSCCLPP_MM_ST1("s32");
  } else if constexpr (std::is_same_v<Tag, MultimemU32> && Words == 1) {
    MSCCLPP_MM_ST1("u32");
  } else {
    static_assert(detail::multimemUnsupported<Tag>, "unsupported multimem vector");
  }
#else
  (void)v;
  (void)p;
  MSCCLPP_DEVICE_CHECK(false, "multimemStore needs sm_90 or newer");
#endif
}

#undef MSCCLPP_MM_LDRED1
#undef MSCCLPP_MM_LDRED2
#undef MSCCLPP_MM_LDRED4
#undef MSCCLPP_MM_ST1
#undef MSCCLPP_MM_ST2
#undef MSCCLPP_MM_ST4

#endif  // defined(MSCCLPP_DEVICE_CUDA)

/// Device-side handle of a SwitchChannel (24 bytes; see core/src/switch_channel.rs).
struct SwitchChannelDeviceHandle {
  /// This device's own copy of the buffer.
  void* devicePtr;
  /// The buffer's multicast address.
  void* mcPtr;
  /// Bytes of the buffer.
  uint64_t bufferSize;

#if defined(MSCCLPP_DEVICE_CUDA)
  /// The sum over every device of vector `index` of the buffer.
  template <typename V>
  MSCCLPP_DEVICE_INLINE V reduce(uint64_t index) const {
    return multimemLoadReduce(reinterpret_cast<const V*>(mcPtr) + index);
  }

  /// Writes `v` as vector `index` of every device's copy.
  template <typename V>
  MSCCLPP_DEVICE_INLINE void broadcast(uint64_t index, const V& v) const {
    multimemStore(v, reinterpret_cast<V*>(mcPtr) + index);
  }

  /// Vectors [first, first + n) become their sum on every device, strided over `numThreads`
  /// threads (each vector reduced and stored by one thread; split the range between devices).
  template <typename V>
  MSCCLPP_DEVICE_INLINE void allReduce(uint64_t first, uint64_t n, uint32_t threadId, uint32_t numThreads) const {
    V* mc = reinterpret_cast<V*>(mcPtr);
    for (uint64_t i = first + threadId; i < first + n; i += numThreads) {
      multimemStore(multimemLoadReduce(mc + i), mc + i);
    }
  }
#endif  // defined(MSCCLPP_DEVICE_CUDA)
};

}  // namespace mscclpp

#endif  // MSCCLPP_SWITCH_CHANNEL_DEVICE_HPP_
