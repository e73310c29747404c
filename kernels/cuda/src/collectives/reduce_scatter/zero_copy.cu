// Reduce-scatter zero_copy (core/src/collectives/zero_copy.rs has the protocol): every rank's input
// (n * B bytes) is registered and mapped here. Each block (its vector part of the own slice):
// handshake with the same block of every peer; read the part of slice `rank` from every rank's
// input (remote 16-byte loads), reduce in rank order, store into the own output; handshake (no
// peer reads this rank's input any more). In place the output is slice `rank` of the own input:
// each element is read before it is written by the same thread, and only this rank touches it.
// Kernels: reducescatter_zero_copy_<dtype>_<op>(CollArgs), extra[0] = u64[nranks] of the inputs
// mapped here (their registrations' starts), extra[1] = B (bytes per rank), extra[2] = where the
// inputs start in their registrations (a view, the same on every rank; 0 for the registrations).
#include "../mesh.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void zeroCopyReduceScatter(const CollArgs& a) {
  const uint64_t* ins = reinterpret_cast<const uint64_t*>(a.extra[0]);
  const uint64_t B = a.extra[1], view = a.extra[2];
  const int rank = a.rank, n = a.nranks, blk = blockIdx.x;
  uint64_t x0, x1;
  blockPart(B, gridDim.x, blk, x0, x1);
  __shared__ const char* srcs[kMaxRanks];
  if (threadIdx.x < (unsigned)n) {
    const int r = threadIdx.x;
    srcs[r] = reinterpret_cast<const char*>(ins[r]) + view + (uint64_t)rank * B + x0;
  }
  meshBarrier(a, blk);
  blockReduce<T, OP>(reinterpret_cast<char*>(a.recv) + x0, nullptr, 0, srcs, n, x1 - x0, n);
  meshBarrier(a, blk);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(reducescatter_zero_copy, mscclpp::coll::zeroCopyReduceScatter)
