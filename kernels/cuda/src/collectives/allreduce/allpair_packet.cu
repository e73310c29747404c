// All-reduce allpair_packet (core/src/collectives/allreduce/allpair_packet.rs has the protocol):
// every rank writes its whole input as LL packets into every peer's scratch region `rank` (every
// warp of every block sends), then all warps reduce the ranks' packets in rank order.
// Packets: LL16 (8-byte words) for every type (docs/perf.md round 28: faster than LL8 from 256 KiB).
// Block b owns the 32-word stripes `(idx / 32) % gridDim.x == b` for both sending and reducing,
// which keeps in-place calls safe behind one __syncthreads.
// Kernels: allreduce_allpair_packet_<dtype>_<op>(CollArgs), extra[0] = words.
#include "../common.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void allpairPacket(const CollArgs& a) {
  using P = LL16Packet;
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
