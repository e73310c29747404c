// All-reduce nvls_zero_copy (core/src/collectives/allreduce/nvls_zero_copy.rs has the protocol):
// input and output are bound to multicast objects of their own; block b of rank r handshakes with
// block b of every peer, load-reduces its vectors of the input in the switch and stores the sums
// into every rank's output (multimem.st), handshakes again. A tail of 4-byte words (byte count not
// a multiple of 16) is done by the last rank's last block.
// Kernels: allreduce_nvls_zero_copy_{f32,f16,bf16}_sum(CollArgs), extra = {in handle*, out handle*}.
#include "../nvls.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void nvlsZeroCopy(const CollArgs& a) {
#if defined(MSCCLPP_DEVICE_CUDA)
  using V = typename NvlsVec<T>::V;
  using V1 = typename NvlsVec<T>::V1;
  const SwitchChannelDeviceHandle& in = nvlsHandle(a, 0);
  const SwitchChannelDeviceHandle& out = nvlsHandle(a, 1);
  const uint64_t bytes = a.count * sizeof(T);
  const uint64_t nv = bytes / 16;
  const int rank = a.rank, n = a.nranks;
  uint64_t v0, v1;
  nvlsBlockVectors(nv, n, rank, gridDim.x, blockIdx.x, v0, v1);
  meshBarrier(a, blockIdx.x);
  for (uint64_t i = v0 + threadIdx.x; i < v1; i += blockDim.x) out.broadcast<V>(i, in.reduce<V>(i));
  if (rank == n - 1 && blockIdx.x == gridDim.x - 1) {
    for (uint64_t w = nv * 4 + threadIdx.x; w < bytes / 4; w += blockDim.x) out.broadcast<V1>(w, in.reduce<V1>(w));
  }
  __threadfence_system();
  meshBarrier(a, blockIdx.x);
#else
  (void)a;
#endif
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_NVLS_INSTANCES(allreduce_nvls_zero_copy, mscclpp::coll::nvlsZeroCopy)
