// Shared device pieces of the NVLS all-reduces (core/src/collectives/nvls.rs is the host side):
// the 16-byte multimem vector of an element type, the work partition (rank r reduces vectors
// split(nv, n, r), block b of them split(len, blocks, b): the same on the host), the zero padding
// of a partial last vector, and the instance macro (f32, f16 and bf16 with sum only: what the switch
// reduces). Multimem exists on CUDA sm_90+ only (switch_channel_device.hpp traps below); under HIP
// the kernels are empty (nvls_usable refuses every ROCm device, so they are never launched).
#ifndef MSCCLPP_COLLECTIVES_NVLS_HPP_
#define MSCCLPP_COLLECTIVES_NVLS_HPP_

#include <mscclpp/switch_channel_device.hpp>

#include "mesh.hpp"

namespace mscclpp {
namespace coll {

/// [begin, end) of part i of n items in `parts` parts (the first n % parts parts get one more).
MSCCLPP_DEVICE_INLINE void nvlsSplit(uint64_t n, uint64_t parts, uint64_t i, uint64_t& b, uint64_t& e) {
  const uint64_t per = n / parts, rem = n % parts;
  b = i * per + (i < rem ? i : rem);
  e = b + per + (i < rem ? 1 : 0);
}

/// Vectors [v0, v1) of nv that block `blk` of `blocks` of rank r of n reduces.
MSCCLPP_DEVICE_INLINE void nvlsBlockVectors(uint64_t nv, int n, int r, uint64_t blocks, uint64_t blk, uint64_t& v0,
                                            uint64_t& v1) {
  uint64_t s0, s1, x0, x1;
  nvlsSplit(nv, (uint64_t)n, (uint64_t)r, s0, s1);
  nvlsSplit(s1 - s0, blocks, blk, x0, x1);
  v0 = s0 + x0;
  v1 = s0 + x1;
}

#if defined(MSCCLPP_DEVICE_CUDA)
/// The multimem vectors of T: 16 bytes (V) and 4 bytes (V1, a buffer's tail words).
template <typename T>
struct NvlsVec;
template <>
struct NvlsVec<float> {
  using V = f32x4;
  using V1 = f32x1;
};
template <>
struct NvlsVec<__half> {
  using V = f16x8;
  using V1 = f16x2;
};
template <>
struct NvlsVec<bf16_t> {
  using V = bf16x8;
  using V1 = bf16x2;
};
#endif

/// All threads of the block zero bytes [from, to) of dst.
MSCCLPP_DEVICE_INLINE void nvlsZero(char* dst, uint64_t from, uint64_t to) {
  for (uint64_t i = from + threadIdx.x; i < to; i += blockDim.x) dst[i] = 0;
}

/// The switch channel handle the host wrote into device memory (CollArgs::extra[k]).
MSCCLPP_DEVICE_INLINE const SwitchChannelDeviceHandle& nvlsHandle(const CollArgs& a, int k) {
  return *reinterpret_cast<const SwitchChannelDeviceHandle*>(a.extra[k]);
}

/// What the pipelined NVLS all-reduces (nvls_warp_pipeline, nvls_block_pipeline) work on: the
/// scratch's switch channel (extra[0]), the input cut in chunks of `piece` bytes (extra[1]), and
/// the input and output.
struct NvlsChunks {
  const SwitchChannelDeviceHandle& h;
  uint64_t piece;
  uint64_t total;
  uint64_t chunks;
  const char* send;
  char* recv;
};

MSCCLPP_DEVICE_INLINE NvlsChunks nvlsChunks(const CollArgs& a, uint64_t elemBytes) {
  const uint64_t piece = a.extra[1], total = a.count * elemBytes;
  return NvlsChunks{nvlsHandle(a, 0), piece, total, (total + piece - 1) / piece,
                    reinterpret_cast<const char*>(a.send), reinterpret_cast<char*>(a.recv)};
}

/// All threads of the block copy `len` bytes of `src` into this rank's copy `local` of the
/// scratch and zero the rest of the last 16-byte vector; returns the vectors (16 bytes each).
MSCCLPP_DEVICE_INLINE uint64_t nvlsStage(char* local, const char* src, uint64_t len) {
  const uint64_t nv = (len + 15) / 16;
  blockCopy(local, src, len);
  nvlsZero(local, len, nv * 16);
  return nv;
}

#if defined(MSCCLPP_DEVICE_CUDA)
/// This rank's share of the `nv` vectors from vector `first` of the scratch: load-reduced over
/// every rank's copy and the sums stored into every copy (multimem), then fenced for the peers.
template <typename T>
MSCCLPP_DEVICE_INLINE void nvlsReduceShare(const CollArgs& a, const SwitchChannelDeviceHandle& h, uint64_t first,
                                           uint64_t nv) {
  uint64_t v0, v1;
  nvlsSplit(nv, a.nranks, a.rank, v0, v1);
  h.allReduce<typename NvlsVec<T>::V>(first + v0, v1 - v0, threadIdx.x, blockDim.x);
  __threadfence_system();
}
#endif

}  // namespace coll
}  // namespace mscclpp

/// `NAME_<dtype>_sum` for f32, f16 and bf16: the types and op multimem reduces.
#define MSCCLPP_NVLS_INSTANCES(NAME, TEMPLATE)                    \
  MSCCLPP_COLL_KERNEL(NAME##_f32_sum, TEMPLATE, float, OpSum)   \
  MSCCLPP_COLL_KERNEL(NAME##_f16_sum, TEMPLATE, __half, OpSum) \
  MSCCLPP_COLL_KERNEL(NAME##_bf16_sum, TEMPLATE, mscclpp::coll::bf16_t, OpSum)

#endif  // MSCCLPP_COLLECTIVES_NVLS_HPP_
