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
  using V = typename NvlsVec<T>::V;
  const SwitchChannelDeviceHandle& h = nvlsHandle(a, 0);
  const uint64_t stage = a.extra[1];
  const uint64_t total = a.count * sizeof(T);
  const uint64_t chunks = (total + stage - 1) / stage;
  char* local = reinterpret_cast<char*>(h.devicePtr);
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  const uint64_t b = blockIdx.x, nb = gridDim.x;
  auto at = [&](uint64_t k) { return (2 * b + k % 2) * stage; };
  auto len = [&](uint64_t j) { return total - j * stage < stage ? total - j * stage : stage; };
  uint64_t k = 0;
  for (uint64_t j = b; j < chunks; j += nb, ++k) {
    const uint64_t l = len(j);
    const uint64_t nv = (l + 15) / 16;
    blockCopy(local + at(k), send + j * stage, l);
    nvlsZero(local + at(k), l, nv * 16);
    meshBarrier(a, b);
    if (k > 0) blockCopy(recv + (j - nb) * stage, local + at(k - 1), len(j - nb));
    uint64_t v0, v1;
    nvlsSplit(nv, a.nranks, a.rank, v0, v1);
    h.allReduce<V>(at(k) / 16 + v0, v1 - v0, threadIdx.x, blockDim.x);
    __threadfence_system();
  }
  if (k > 0) {
    meshBarrier(a, b);
    const uint64_t last = b + (k - 1) * nb;
    blockCopy(recv + last * stage, local + at(k - 1), len(last));
  }
#else
  (void)a;
#endif
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_NVLS_INSTANCES(allreduce_nvls_block_pipeline, mscclpp::coll::nvlsBlockPipeline)
