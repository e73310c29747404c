// All-reduce rsag_zero_copy (core/src/collectives/allreduce/rsag_zero_copy.rs has the protocol):
// the user buffers of every rank are registered and mapped here. Each block (its vector part of the
// own slice): handshake with the same block of every peer; read the part from every rank's input
// (remote 16-byte loads), reduce in rank order, store into the own output and every peer's output;
// handshake. Kernels: allreduce_rsag_zero_copy_<dtype>_<op>(CollArgs), extra[0] = u64[nranks] of
// the inputs mapped here (their registrations' starts), extra[1] = the same for the outputs,
// extra[2] = slice bytes, extra[3] / extra[4] = where the inputs / outputs start in their
// registrations (views, the same on every rank; 0 for the registrations themselves).
#include "../mesh.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void rsagZeroCopyAllreduce(const CollArgs& a) {
  const uint64_t* ins = reinterpret_cast<const uint64_t*>(a.extra[0]);
  const uint64_t* outs = reinterpret_cast<const uint64_t*>(a.extra[1]);
  const uint64_t S = a.extra[2], inView = a.extra[3], outView = a.extra[4];
  const uint64_t total = a.count * sizeof(T);
  const int rank = a.rank, n = a.nranks, blk = blockIdx.x;
  const uint64_t begin = (uint64_t)rank * S;
  const uint64_t len = begin >= total ? 0 : (total - begin < S ? total - begin : S);
  uint64_t x0, x1;
  blockPart(len, gridDim.x, blk, x0, x1);
  __shared__ const char* srcs[kMaxRanks];
  __shared__ char* dsts[kMaxRanks];
  if (threadIdx.x < (unsigned)n) {
    const int r = threadIdx.x;
    srcs[r] = reinterpret_cast<const char*>(ins[r]) + inView + begin + x0;
    // dsts[0..n-1): the peers' outputs, in the order after this rank.
    if (r != rank) {
      dsts[(r - rank - 1 + n) % n] = reinterpret_cast<char*>(outs[r]) + outView + begin + x0;
    }
  }
  meshBarrier(a, blk);
  blockReduce<T, OP>(reinterpret_cast<char*>(a.recv) + begin + x0, dsts, n - 1, srcs, n, x1 - x0, n);
  meshBarrier(a, blk);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_rsag_zero_copy, mscclpp::coll::rsagZeroCopyAllreduce)
