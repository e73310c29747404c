// All-reduce packet (core/src/collectives/allreduce/packet.rs has the protocol): two phases in
// LL16 packets. Phase 1: slice p of the input -> rank p's phase-1 area, region `rank`. Phase 2:
// the owner reduces its slice in rank order, stores it and sends it to every peer's phase-2 area.
// Phase 3: the other slices are unpacked from the own phase-2 area. Block b owns the 32-word
// stripes `(j / 32) % gridDim.x == b` of every slice in every phase.
// Kernels: allreduce_packet_<dtype>_<op>(CollArgs), extra[0] = words per slice.
#include "../common.hpp"

namespace mscclpp {
namespace coll {

/// Word j of the t-th item of this block's stripes (or >= sw when past the end).
MSCCLPP_DEVICE_INLINE uint64_t stripeWord(uint64_t t) {
  return ((t / kWarp) * gridDim.x + blockIdx.x) * kWarp + (t % kWarp);
}

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void packetAllreduce(const CollArgs& a) {
  using W = uint2;
  const uint64_t total = a.count * sizeof(T);
  const uint64_t sw = a.extra[0];
  const int rank = a.rank, n = a.nranks;
  const uint32_t flag = blockFlag(a);
  // Phase 1: my input's slice p to rank p.
  for (int q = 0; q < n - 1; ++q) {
    const int p = (rank + 1 + q) % n;
    LL16Packet* dst = reinterpret_cast<LL16Packet*>(llHalf(a, a.peerBases[p], flag)) + (uint64_t)rank * sw;
    for (uint64_t t = threadIdx.x;; t += blockDim.x) {
      const uint64_t j = stripeWord(t);
      if (j >= sw) break;
      dst[j].write(loadWord<W>(a.send, (uint64_t)p * sw + j, total), flag);
    }
  }
  // Phase 2: reduce my slice, keep it, send it to every peer.
  const LL16Packet* mine = reinterpret_cast<const LL16Packet*>(llHalf(a, a.peerBases[rank], flag));
  for (uint64_t t = threadIdx.x;; t += blockDim.x) {
    const uint64_t j = stripeWord(t);
    if (j >= sw) break;
    AccPack<T, W> acc;
    for (int r = 0; r < n; ++r) {
      const W v = (r == rank) ? loadWord<W>(a.send, (uint64_t)rank * sw + j, total) : mine[(uint64_t)r * sw + j].read(flag);
      acc.template fold<OP>(r, v);
    }
    const W res = acc.template store<OP>(n);
    storeWord<W>(a.recv, (uint64_t)rank * sw + j, total, res);
    for (int q = 0; q < n - 1; ++q) {
      const int p = (rank + 1 + q) % n;
      LL16Packet* dst = reinterpret_cast<LL16Packet*>(llHalf(a, a.peerBases[p], flag)) + (uint64_t)(n + rank) * sw;
      dst[j].write(res, flag);
    }
  }
  // Phase 3: the other slices.
  for (int q = 0; q < n - 1; ++q) {
    const int s = (rank + 1 + q) % n;
    const LL16Packet* src = mine + (uint64_t)(n + s) * sw;
    for (uint64_t t = threadIdx.x;; t += blockDim.x) {
      const uint64_t j = stripeWord(t);
      if (j >= sw) break;
      storeWord<W>(a.recv, (uint64_t)s * sw + j, total, src[j].read(flag));
    }
  }
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_packet, mscclpp::coll::packetAllreduce)
