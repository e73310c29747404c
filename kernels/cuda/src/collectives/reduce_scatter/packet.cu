// Reduce-scatter packet (core/src/collectives/reduce_scatter/packet.rs has the protocol): every
// rank writes block p of its input as LL packets into region `rank` of rank p's LL half (every warp
// of every block sends), then all warps reduce their own block over the ranks in rank order
// (the own input for this rank, the peers' packets otherwise). One hop, for small messages.
// Packets: LL16 (8-byte words) for every type: half as many packets as LL8 for the same bytes, as fast
// or faster at every size measured (docs/perf.md round 28).
// Block b owns the 32-word stripes `(idx / 32) % gridDim.x == b` for sending and reducing. In
// place (`recv == send + rank * bytes`) each word of the own block is read before it is written,
// by the same thread; the sends read only the other blocks.
// Kernels: reducescatter_packet_<dtype>_<op>(CollArgs), extra[0] = words per block.
#include "../common.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void reduceScatterPacket(const CollArgs& a) {
  using P = LL16Packet;
  const uint64_t total = a.count * sizeof(T);
  const uint64_t nWords = a.extra[0];
  const uint32_t flag = blockFlag(a);
  const char* send = reinterpret_cast<const char*>(a.send);
  llSendToPeers<P>(a, flag, nWords, total, [&](int peer) { return send + (uint64_t)peer * total; });
  // The sends read only the peers' blocks; in place the own block is the output.
  llReduceFromPeers<T, OP, P>(a, flag, nWords, total, send + (uint64_t)a.rank * total);
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(reducescatter_packet, mscclpp::coll::reduceScatterPacket)
