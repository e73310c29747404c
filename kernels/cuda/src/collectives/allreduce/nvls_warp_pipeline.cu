// All-reduce nvls_warp_pipeline (core/src/collectives/allreduce/nvls_warp_pipeline.rs has the
// protocol): block b owns region b (extra[1] bytes) of the NVLS scratch and chunks j = b, b + blocks,
// ... of the input; per chunk it copies the chunk in (zero padding the last vector), handshakes
// with block b of every peer, load-reduces its rank's share of the chunk's vectors over every
// rank's copy and stores the sums into every copy (multimem), handshakes, copies the chunk out.
// Kernels: allreduce_nvls_warp_pipeline_{f32,f16,bf16}_sum(CollArgs), extra = {handle*, region}.
#include "../nvls.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void nvlsWarpPipeline(const CollArgs& a) {
#if defined(MSCCLPP_DEVICE_CUDA)
  using V = typename NvlsVec<T>::V;
  const SwitchChannelDeviceHandle& h = nvlsHandle(a, 0);
  const uint64_t region = a.extra[1];
  const uint64_t total = a.count * sizeof(T);
  const uint64_t chunks = (total + region - 1) / region;
  const uint64_t base = (uint64_t)blockIdx.x * region;
  char* local = reinterpret_cast<char*>(h.devicePtr) + base;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  for (uint64_t j = blockIdx.x; j < chunks; j += gridDim.x) {
    const uint64_t o = j * region;
    const uint64_t l = total - o < region ? total - o : region;
    const uint64_t nv = (l + 15) / 16;
    blockCopy(local, send + o, l);
    nvlsZero(local, l, nv * 16);
    meshBarrier(a, blockIdx.x);
    uint64_t v0, v1;
    nvlsSplit(nv, a.nranks, a.rank, v0, v1);
    h.allReduce<V>(base / 16 + v0, v1 - v0, threadIdx.x, blockDim.x);
    __threadfence_system();
    meshBarrier(a, blockIdx.x);
    blockCopy(recv + o, local, l);
  }
#else
  (void)a;
#endif
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_NVLS_INSTANCES(allreduce_nvls_warp_pipeline, mscclpp::coll::nvlsWarpPipeline)
