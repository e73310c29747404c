// All-reduce nvls_block_pipeline (core/src/collectives/allreduce/nvls_block_pipeline.rs has the
// protocol): as nvls_warp_pipeline with two stages per block used alternately, one handshake per
// chunk: in its k-th chunk block b copies the chunk into stage k % 2, handshakes, copies chunk k-1's
// sums out of stage (k-1) % 2, load-reduces + stores its rank's share of chunk k; after the last
// chunk one more handshake and its copy-out.
// Kernels: allreduce_nvls_block_pipeline_{f32,f16,bf16}_sum(CollArgs), extra = {handle*, stage}.
#include "../nvls.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void nvlsBlockPipeline(const CollArgs& a) {
#if defined(MSCCLPP_DEVICE_CUDA)
  const NvlsChunks c = nvlsChunks(a, sizeof(T));
  const uint64_t stage = c.piece;
  char* local = reinterpret_cast<char*>(c.h.devicePtr);
  const uint64_t b = blockIdx.x, nb = gridDim.x;
  auto at = [&](uint64_t k) { return (2 * b + k % 2) * stage; };
  auto len = [&](uint64_t j) { return c.total - j * stage < stage ? c.total - j * stage : stage; };
  uint64_t k = 0;
  for (uint64_t j = b; j < c.chunks; j += nb, ++k) {
    const uint64_t nv = nvlsStage(local + at(k), c.send + j * stage, len(j));
    meshBarrier(a, b);
    if (k > 0) blockCopy(c.recv + (j - nb) * stage, local + at(k - 1), len(j - nb));
    nvlsReduceShare<T>(a, c.h, at(k) / 16, nv);
  }
  if (k > 0) {
    meshBarrier(a, b);
    const uint64_t last = b + (k - 1) * nb;
    blockCopy(c.recv + last * stage, local + at(k - 1), len(last));
  }
#else
  (void)a;
#endif
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_NVLS_INSTANCES(allreduce_nvls_block_pipeline, mscclpp::coll::nvlsBlockPipeline)
