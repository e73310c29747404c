// Shared pieces of the collective kernels (CUDA and HIP): the argument block, element types with
// their accumulators, the reduction ops, 16-byte vector helpers, LL flag handling and the
// instantiation macro that names kernels `<base>_<dtype>_<op>`.
//
// Element rules (mirrored by core/src/collectives/host_math.rs): integers wrap (computed in the
// unsigned type of the same width), f16/bf16/fp8 accumulate in f32, avg = sum / nranks applied once
// at the end (integers truncate toward zero). min/max: `b < a ? b : a` / `b > a ? b : a`.
#ifndef MSCCLPP_COLLECTIVES_COMMON_HPP_
#define MSCCLPP_COLLECTIVES_COMMON_HPP_

#include <mscclpp/memory_channel_device.hpp>
#include <mscclpp/packet_device.hpp>
#include <mscclpp/semaphore_device.hpp>

#if defined(MSCCLPP_DEVICE_HIP)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define MSCCLPP_COLL_HAS_FP8 1
#endif

namespace mscclpp {
namespace coll {

/// struct CollArgs (core/src/collectives/algorithm.rs), 136 bytes.
struct CollArgs {
  const void* send;
  void* recv;
  uint64_t count;
  const uint64_t* peerBases;                    // [nranks] shared buffer of every rank, mapped here
  MemoryDevice2DeviceSemaphoreDeviceHandle* sems;  // [MAX_SEM_BLOCKS][nranks]
  uint32_t* flags;                              // [nflags]
  uint64_t llOffset;
  uint64_t llHalfBytes;
  uint64_t plainOffset;
  uint64_t plainBytes;
  int32_t rank;
  int32_t nranks;
  int32_t root;
  uint32_t nflags;
  uint64_t extra[5];
};

constexpr int kWarp = 32;

enum Op { OpSum = 0, OpProd = 1, OpMin = 2, OpMax = 3, OpAvg = 4 };

/// bfloat16 as raw bits (portable between CUDA and HIP; round-to-nearest-even on narrowing).
struct bf16_t {
  uint16_t bits;
};

template <typename T>
struct Elem {
  using Acc = T;
  MSCCLPP_DEVICE_INLINE static Acc up(T v) { return v; }
  MSCCLPP_DEVICE_INLINE static T down(Acc v) { return v; }
};
template <>
struct Elem<__half> {
  using Acc = float;
  MSCCLPP_DEVICE_INLINE static float up(__half v) { return __half2float(v); }
  MSCCLPP_DEVICE_INLINE static __half down(float v) { return __float2half_rn(v); }
};
template <>
struct Elem<bf16_t> {
  using Acc = float;
  MSCCLPP_DEVICE_INLINE static float up(bf16_t v) { return __uint_as_float((uint32_t)v.bits << 16); }
  MSCCLPP_DEVICE_INLINE static bf16_t down(float f) {
    uint32_t u = __float_as_uint(f);
    bf16_t r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      r.bits = (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    } else {
      r.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return r;
  }
};
#if defined(MSCCLPP_COLL_HAS_FP8)
/// The fp8 types: accumulated in float through their own conversions.
template <typename T>
struct FloatConvElem {
  using Acc = float;
  MSCCLPP_DEVICE_INLINE static float up(T v) { return float(v); }
  MSCCLPP_DEVICE_INLINE static T down(float v) { return T(v); }
};
template <>
struct Elem<__nv_fp8_e4m3> : FloatConvElem<__nv_fp8_e4m3> {};
template <>
struct Elem<__nv_fp8_e5m2> : FloatConvElem<__nv_fp8_e5m2> {};
#endif

/// The unsigned type integers are combined in (wrap-around instead of signed overflow).
template <typename T> struct Unsigned { using type = T; };
template <> struct Unsigned<int8_t> { using type = uint32_t; };
template <> struct Unsigned<uint8_t> { using type = uint32_t; };
template <> struct Unsigned<int32_t> { using type = uint32_t; };
template <> struct Unsigned<int64_t> { using type = uint64_t; };

template <typename T> struct IsInt { static constexpr bool value = false; };
template <> struct IsInt<int8_t> { static constexpr bool value = true; };
template <> struct IsInt<uint8_t> { static constexpr bool value = true; };
template <> struct IsInt<int32_t> { static constexpr bool value = true; };
template <> struct IsInt<uint32_t> { static constexpr bool value = true; };
template <> struct IsInt<int64_t> { static constexpr bool value = true; };
template <> struct IsInt<uint64_t> { static constexpr bool value = true; };

template <int OP, typename A>
MSCCLPP_DEVICE_INLINE A combine(A a, A b) {
  if constexpr (IsInt<A>::value) {
    using U = typename Unsigned<A>::type;
    if constexpr (OP == OpSum || OP == OpAvg) return (A)((U)a + (U)b);
    if constexpr (OP == OpProd) return (A)((U)a * (U)b);
  } else {
    if constexpr (OP == OpSum || OP == OpAvg) return a + b;
    if constexpr (OP == OpProd) return a * b;
  }
  if constexpr (OP == OpMin) return b < a ? b : a;
  if constexpr (OP == OpMax) return b > a ? b : a;
  return a;
}

template <int OP, typename A>
MSCCLPP_DEVICE_INLINE A finish(A a, int nranks) {
  if constexpr (OP == OpAvg) return a / (A)nranks;
  return a;
}

/// N elements of T viewed as one W-byte word (W = 4, 8 or 16).
template <typename T, typename W>
union Pack {
  static constexpr int N = sizeof(W) / sizeof(T);
  W w;
  T v[N];
};

/// Accumulators of one W-byte word.
template <typename T, typename W>
struct AccPack {
  using A = typename Elem<T>::Acc;
  static constexpr int N = sizeof(W) / sizeof(T);
  A a[N];
  MSCCLPP_DEVICE_INLINE void load(W w) {
    Pack<T, W> p;
    p.w = w;
#pragma unroll
    for (int i = 0; i < N; ++i) a[i] = Elem<T>::up(p.v[i]);
  }
  template <int OP>
  MSCCLPP_DEVICE_INLINE void add(W w) {
    Pack<T, W> p;
    p.w = w;
#pragma unroll
    for (int i = 0; i < N; ++i) a[i] = combine<OP>(a[i], Elem<T>::up(p.v[i]));
  }
  /// Source `i` of a reduction taken in source order: source 0 loads, the others combine.
  template <int OP>
  MSCCLPP_DEVICE_INLINE void fold(int i, W w) {
    if (i == 0) {
      load(w);
    } else {
      add<OP>(w);
    }
  }
  template <int OP>
  MSCCLPP_DEVICE_INLINE W store(int nranks) const {
    Pack<T, W> p;
#pragma unroll
    for (int i = 0; i < N; ++i) p.v[i] = Elem<T>::down(finish<OP>(a[i], nranks));
    return p.w;
  }
};

/// Loads word `idx` (W bytes) of a `total`-byte buffer, zero-padding bytes past the end.
template <typename W>
MSCCLPP_DEVICE_INLINE W loadWord(const void* base, uint64_t idx, uint64_t total) {
  const uint64_t off = idx * sizeof(W);
  if (off + sizeof(W) <= total && ((uintptr_t)base % sizeof(W)) == 0) return reinterpret_cast<const W*>(base)[idx];
  union {
    W w;
    uint8_t b[sizeof(W)];
  } u;
#pragma unroll
  for (int i = 0; i < (int)sizeof(W); ++i) u.b[i] = (off + i < total) ? reinterpret_cast<const uint8_t*>(base)[off + i] : 0;
  return u.w;
}

/// Stores the bytes of word `idx` that lie inside the `total`-byte buffer.
template <typename W>
MSCCLPP_DEVICE_INLINE void storeWord(void* base, uint64_t idx, uint64_t total, W w) {
  const uint64_t off = idx * sizeof(W);
  if (off + sizeof(W) <= total && ((uintptr_t)base % sizeof(W)) == 0) {
    reinterpret_cast<W*>(base)[idx] = w;
    return;
  }
  union {
    W w;
    uint8_t b[sizeof(W)];
  } u;
  u.w = w;
  for (int i = 0; i < (int)sizeof(W); ++i)
    if (off + i < total) reinterpret_cast<uint8_t*>(base)[off + i] = u.b[i];
}

/// The LL flag of this block, and the end-of-launch bump of every flag entry (each block bumps
/// its own entry; threads beyond the grid bump the entries no block of this launch owns), so every
/// entry stays equal and a later launch with more blocks reads the same flag.
/// Every thread of the block calls `bumpFlags` (no thread may have returned early): its block
/// barrier keeps thread 0 from bumping the entry before every warp of the block has read it (as
/// the executor's runFinish does). Without it a warp that read the entry late would send its
/// packets with the next launch's flag into the other LL half, and the peer block waiting for
/// them would spin until its bound: the likely cause of the one hang of the reduce-scatter
/// `packet` seen so far (an H100 shared by 4 ranks, docs/perf.md round 29).
MSCCLPP_DEVICE_INLINE uint32_t blockFlag(const CollArgs& a) { return a.flags[blockIdx.x]; }
MSCCLPP_DEVICE_INLINE void bumpFlags(const CollArgs& a, uint32_t flag) {
  __syncthreads();
  if (threadIdx.x == 0) a.flags[blockIdx.x] = flag + 1;
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  for (uint32_t i = tid; i < a.nflags; i += gridDim.x * blockDim.x) {
    if (i >= gridDim.x) a.flags[i] = flag + 1;
  }
}

/// The LL half of `flag` in the shared buffer based at `base`.
MSCCLPP_DEVICE_INLINE char* llHalf(const CollArgs& a, uint64_t base, uint32_t flag) {
  return reinterpret_cast<char*>(base) + a.llOffset + (uint64_t)(flag & 1u) * a.llHalfBytes;
}

// ---- the one-hop LL exchange (allreduce/allpair_packet.cu, allgather/packet.cu,
// reduce_scatter/packet.cu; core/src/collectives/allpair.rs) ----
// Every rank writes words of its input as packets into region `rank` (nWords packets each) of
// every peer's LL half, then reads the regions its peers wrote into its own. Block b owns the
// 32-word stripes `(idx / 32) % gridDim.x == b` on both sides, so a block only waits for the
// same block of its peers.

/// The sends: the words of this block's stripes of `src(peer)` (a `total`-byte buffer) as packets
/// into region `rank` of every peer's LL half. Every warp of the block sends: the (stripe, peer)
/// pairs of the block go round robin over its warps, peers fastest, so the warps that send one
/// stripe to several peers read it at about the same time.
template <typename P, typename Src>
MSCCLPP_DEVICE_INLINE void llSendToPeers(const CollArgs& a, uint32_t flag, uint64_t nWords, uint64_t total,
                                         Src src) {
  using W = typename P::Payload;
  const uint32_t warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const uint32_t nWarps = blockDim.x / kWarp;
  const uint32_t peers = (uint32_t)a.nranks - 1;
  const uint64_t nStripes = (nWords + kWarp - 1) / kWarp;
  // This block's stripes: blockIdx.x, blockIdx.x + gridDim.x, ...
  const uint32_t mine =
      nStripes > blockIdx.x ? (uint32_t)((nStripes - blockIdx.x + gridDim.x - 1) / gridDim.x) : 0u;
  const uint32_t pairs = mine * peers;
  for (uint32_t j = warp; j < pairs; j += nWarps) {
    const uint32_t w = j % peers;
    const int peer = (int)w < a.rank ? (int)w : (int)w + 1;
    const uint64_t idx = ((uint64_t)(j / peers) * gridDim.x + blockIdx.x) * kWarp + lane;
    if (idx < nWords) {
      P* dst = reinterpret_cast<P*>(llHalf(a, a.peerBases[peer], flag)) + (uint64_t)a.rank * nWords;
      dst[idx].write(loadWord<W>(src(peer), idx, total), flag);
    }
  }
}

/// This thread's first word of its block's stripes on the receiving side, and the step to its
/// next (every warp of the block takes its own words).
MSCCLPP_DEVICE_INLINE uint64_t llFirstWord() {
  return threadIdx.x % kWarp + (uint64_t)blockIdx.x * kWarp + (uint64_t)(threadIdx.x / kWarp) * gridDim.x * kWarp;
}
MSCCLPP_DEVICE_INLINE uint64_t llWordStep() { return (uint64_t)(blockDim.x / kWarp) * gridDim.x * kWarp; }

/// The out-of-place copy of a one-hop exchange's own part: this thread's words of its block's
/// stripes of `src` into `dst` (both `total`-byte buffers), the words the block's sends read.
template <typename W>
MSCCLPP_DEVICE_INLINE void llCopyOwnWords(void* dst, const void* src, uint64_t nWords, uint64_t total) {
  for (uint64_t idx = llFirstWord(); idx < nWords; idx += llWordStep()) {
    storeWord<W>(dst, idx, total, loadWord<W>(src, idx, total));
  }
}

/// The receiving side of a reducing exchange: each of this thread's words folded over the ranks
/// in rank order (this rank's from `own`, a `total`-byte buffer; the others' from their regions
/// of this rank's LL half) into `a.recv`. Each word of `own` is read before the same thread
/// writes it, so `own` may be the output.
template <typename T, int OP, typename P>
MSCCLPP_DEVICE_INLINE void llReduceFromPeers(const CollArgs& a, uint32_t flag, uint64_t nWords, uint64_t total,
                                             const void* own) {
  using W = typename P::Payload;
  const P* mine = reinterpret_cast<const P*>(llHalf(a, a.peerBases[a.rank], flag));
  for (uint64_t idx = llFirstWord(); idx < nWords; idx += llWordStep()) {
    AccPack<T, W> acc;
    for (int r = 0; r < a.nranks; ++r) {
      const W v = (r == a.rank) ? loadWord<W>(own, idx, total) : mine[(uint64_t)r * nWords + idx].read(flag);
      acc.template fold<OP>(r, v);
    }
    storeWord<W>(a.recv, idx, total, acc.template store<OP>(a.nranks));
  }
}

}  // namespace coll
}  // namespace mscclpp

/// One `extern "C"` kernel `KNAME(CollArgs)` running `TEMPLATE<TYPE, mscclpp::coll::OP>`.
#define MSCCLPP_COLL_KERNEL(KNAME, TEMPLATE, TYPE, OP)                                       \
  extern "C" __global__ void __launch_bounds__(1024) KNAME(mscclpp::coll::CollArgs a) { \
    TEMPLATE<TYPE, mscclpp::coll::OP>(a);                                                  \
  }

#define MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, TYPE, TNAME)              \
  MSCCLPP_COLL_KERNEL(NAME##_##TNAME##_sum, TEMPLATE, TYPE, OpSum)   \
  MSCCLPP_COLL_KERNEL(NAME##_##TNAME##_prod, TEMPLATE, TYPE, OpProd) \
  MSCCLPP_COLL_KERNEL(NAME##_##TNAME##_min, TEMPLATE, TYPE, OpMin)   \
  MSCCLPP_COLL_KERNEL(NAME##_##TNAME##_max, TEMPLATE, TYPE, OpMax)   \
  MSCCLPP_COLL_KERNEL(NAME##_##TNAME##_avg, TEMPLATE, TYPE, OpAvg)

#if defined(MSCCLPP_COLL_HAS_FP8)
#define MSCCLPP_COLL_FP8_INSTANCES(NAME, TEMPLATE)                     \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, __nv_fp8_e4m3, fp8e4m3) \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, __nv_fp8_e5m2, fp8e5m2)
#else
#define MSCCLPP_COLL_FP8_INSTANCES(NAME, TEMPLATE)
#endif

/// Every data type x op of `TEMPLATE<T, OP>(CollArgs)` as `extern "C"` kernels `NAME_<dtype>_<op>`.
#define MSCCLPP_COLL_INSTANCES(NAME, TEMPLATE)                        \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, int8_t, i8)               \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, uint8_t, u8)              \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, int32_t, i32)             \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, uint32_t, u32)            \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, int64_t, i64)             \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, uint64_t, u64)            \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, __half, f16)              \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, float, f32)               \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, double, f64)              \
  MSCCLPP_COLL_OP_INSTANCES(NAME, TEMPLATE, mscclpp::coll::bf16_t, bf16) \
  MSCCLPP_COLL_FP8_INSTANCES(NAME, TEMPLATE)

#endif  // MSCCLPP_COLLECTIVES_COMMON_HPP_
