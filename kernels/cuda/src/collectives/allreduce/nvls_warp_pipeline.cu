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
  const NvlsChunks c = nvlsChunks(a, sizeof(T));
  const uint64_t region = c.piece;
  const uint64_t base = (uint64_t)blockIdx.x * region;
  char* local = reinterpret_cast<char*>(c.h.devicePtr) + base;
  for (uint64_t j = blockIdx.x; j < c.chunks; j += gridDim.x) {
    const uint64_t o = j * region;
    const uint64_t l = c.total - o < region ? c.total - o : region;
    const uint64_t nv = nvlsStage(local, c.send + o, l);
    meshBarrier(a, blockIdx.x);
    nvlsReduceShare<T>(a, c.h, base / 16, nv);
    meshBarrier(a, blockIdx.x);
    blockCopy(c.recv + o, local, l);
  }
#else
  (void)a;
#endif
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_NVLS_INSTANCES(allreduce_nvls_warp_pipeline, mscclpp::coll::nvlsWarpPipeline)
