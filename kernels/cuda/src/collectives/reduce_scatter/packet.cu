// Reduce-scatter packet (core/src/collectives/reduce_scatter/packet.rs has the protocol): every
// rank writes block p of its input as LL packets into region `rank` of rank p's LL half (one warp
// per peer in every block), then all warps reduce their own block over the ranks in rank order
// (the own input for this rank, the peers' packets otherwise). One hop, for small messages.
// Packets: LL8 (4-byte words) for elements up to 4 bytes, LL16 (8-byte words) for 8-byte ones.
// Block b owns the 32-word stripes `(idx / 32) % gridDim.x == b` for sending and reducing. In
// place (`recv == send + rank * bytes`) each word of the own block is read before it is written,
// by the same thread; the sends read only the other blocks.
// Kernels: reducescatter_packet_<dtype>_<op>(CollArgs), extra[0] = words per block.
#include <type_traits>

#include "../common.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void reduceScatterPacket(const CollArgs& a) {
  using P = typename std::conditional<(sizeof(T) <= 4), LL8Packet, LL16Packet>::type;
  using W = typename P::Payload;
  const uint64_t total = a.count * sizeof(T);
  const uint64_t nWords = a.extra[0];
  const int rank = a.rank, n = a.nranks;
  const uint32_t flag = blockFlag(a);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int nWarps = blockDim.x / kWarp;
  const uint64_t stripeStep = (uint64_t)gridDim.x * kWarp;
  const char* send = reinterpret_cast<const char*>(a.send);
  for (int w = warp; w < n - 1; w += nWarps) {
    const int peer = w < rank ? w : w + 1;
    P* dst = reinterpret_cast<P*>(llHalf(a, a.peerBases[peer], flag)) + (uint64_t)rank * nWords;
    const char* src = send + (uint64_t)peer * total;
    for (uint64_t idx = lane + (uint64_t)blockIdx.x * kWarp; idx < nWords; idx += stripeStep) {
      dst[idx].write(loadWord<W>(src, idx, total), flag);
    }
  }
  const P* mine = reinterpret_cast<const P*>(llHalf(a, a.peerBases[rank], flag));
  const char* own = send + (uint64_t)rank * total;
  for (uint64_t idx = lane + (uint64_t)blockIdx.x * kWarp + (uint64_t)warp * stripeStep; idx < nWords;
       idx += (uint64_t)nWarps * stripeStep) {
    AccPack<T, W> acc;
    for (int r = 0; r < n; ++r) {
      const W v = (r == rank) ? loadWord<W>(own, idx, total) : mine[(uint64_t)r * nWords + idx].read(flag);
      acc.template fold<OP>(r, v);
    }
    storeWord<W>(a.recv, idx, total, acc.template store<OP>(n));
  }
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(reducescatter_packet, mscclpp::coll::reduceScatterPacket)
