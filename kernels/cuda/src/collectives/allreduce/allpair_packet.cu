// All-reduce allpair_packet (core/src/collectives/allreduce/allpair_packet.rs has the protocol):
// every rank writes its whole input as LL packets into every peer's scratch region `rank` (every
// warp of every block sends), then all warps reduce the ranks' packets in rank order.
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
  const uint64_t total = a.count * sizeof(T);
  const uint64_t nWords = a.extra[0];
  const uint32_t flag = blockFlag(a);
  llSendToPeers<P>(a, flag, nWords, total, [&](int) { return a.send; });
  // In place, the block's sends have read its words before its reduction writes them.
  __syncthreads();
  llReduceFromPeers<T, OP, P>(a, flag, nWords, total, a.send);
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_allpair_packet, mscclpp::coll::allpairPacket)
