// All-reduce allpair_packet (core/src/collectives/allreduce/allpair_packet.rs has the protocol):
// every rank writes its whole input as LL packets into every peer's scratch region `rank` (one
// warp per peer in every block), then all warps reduce the ranks' packets in rank order.
// Packets: LL8 (4-byte words) for elements up to 4 bytes, LL16 (8-byte words) for 8-byte ones.
// Block b owns the 32-word stripes `(idx / 32) % gridDim.x == b` for both sending and reducing,
// which keeps in-place calls safe behind one __syncthreads.
// Kernels: allreduce_allpair_packet_<dtype>_<op>(CollArgs), extra[0] = words.
#include <type_traits>

#include "../common.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void allpairPacket(const CollArgs& a) {
  using P = typename std::conditional<(sizeof(T) <= 4), LL8Packet, LL16Packet>::type;
  using W = typename P::Payload;
  const uint64_t total = a.count * sizeof(T);
  const uint64_t nWords = a.extra[0];
  const int rank = a.rank, n = a.nranks;
  const uint32_t flag = blockFlag(a);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int nWarps = blockDim.x / kWarp;
  const uint64_t stripeStep = (uint64_t)gridDim.x * kWarp;
  for (int w = warp; w < n - 1; w += nWarps) {
    const int peer = w < rank ? w : w + 1;
    P* dst = reinterpret_cast<P*>(llHalf(a, a.peerBases[peer], flag)) + (uint64_t)rank * nWords;
    for (uint64_t idx = lane + (uint64_t)blockIdx.x * kWarp; idx < nWords; idx += stripeStep) {
      dst[idx].write(loadWord<W>(a.send, idx, total), flag);
    }
  }
  __syncthreads();
  const P* mine = reinterpret_cast<const P*>(llHalf(a, a.peerBases[rank], flag));
  for (uint64_t idx = lane + (uint64_t)blockIdx.x * kWarp + (uint64_t)warp * stripeStep; idx < nWords;
       idx += (uint64_t)nWarps * stripeStep) {
    AccPack<T, W> acc;
    for (int r = 0; r < n; ++r) {
      const W v = (r == rank) ? loadWord<W>(a.send, idx, total) : mine[(uint64_t)r * nWords + idx].read(flag);
      acc.template fold<OP>(r, v);
    }
    storeWord<W>(a.recv, idx, total, acc.template store<OP>(n));
  }
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_allpair_packet, mscclpp::coll::allpairPacket)
