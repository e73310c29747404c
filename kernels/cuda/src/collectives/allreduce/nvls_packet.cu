// All-reduce nvls_packet (core/src/collectives/allreduce/nvls_packet.rs has the protocol): every
// rank stores its input as LL16 packets into slot `rank` of half `flag & 1` of the NVLS scratch
// through the multicast address (one multimem.st lands in every rank's copy), then reads all n
// slots from its own copy, waiting for each packet's flag, and reduces them in rank order. Block b
// owns packets split(W, blocks, b) of every slot. The switch only broadcasts, so every type and op
// is instantiated. Kernels: allreduce_nvls_packet_<dtype>_<op>(CollArgs), extra = {handle*, W,
// half: bytes of a scratch half (halves at fixed offsets, whatever the call's size)}.
#include "../nvls.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void nvlsPacket(const CollArgs& a) {
#if defined(MSCCLPP_DEVICE_CUDA)
  const SwitchChannelDeviceHandle& h = nvlsHandle(a, 0);
  const uint64_t W = a.extra[1];
  const uint64_t total = a.count * sizeof(T);
  const int rank = a.rank, n = a.nranks;
  const uint32_t flag = blockFlag(a);
  const uint64_t half = (uint64_t)(flag & 1u) * a.extra[2];
  f32x4* mc = reinterpret_cast<f32x4*>(reinterpret_cast<char*>(h.mcPtr) + half);
  const LL16Packet* mine = reinterpret_cast<const LL16Packet*>(reinterpret_cast<const char*>(h.devicePtr) + half);
  uint64_t j0, j1;
  nvlsSplit(W, gridDim.x, blockIdx.x, j0, j1);
  for (uint64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    const uint2 d = loadWord<uint2>(a.send, j, total);
    f32x4 v;
    v.words[0] = d.x;
    v.words[1] = flag;
    v.words[2] = d.y;
    v.words[3] = flag;
    multimemStore(v, mc + (uint64_t)rank * W + j);
  }
  for (uint64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    AccPack<T, uint2> acc;
    for (int r = 0; r < n; ++r) {
      const uint2 w = mine[(uint64_t)r * W + j].read(flag);
      acc.template fold<OP>(r, w);
    }
    storeWord<uint2>(a.recv, j, total, acc.template store<OP>(n));
  }
  bumpFlags(a, flag);
#else
  (void)a;
#endif
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_nvls_packet, mscclpp::coll::nvlsPacket)
