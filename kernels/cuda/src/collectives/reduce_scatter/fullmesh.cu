// Reduce-scatter fullmesh (core/src/collectives/reduce_scatter/fullmesh.rs has the protocol): per
// chunk of C bytes of every rank's block of the input, each block (its vector part of the chunk):
// handshake with the same block of every peer; write the part of peer p's block of the input into
// slot `rank` of peer p's plain scratch; handshake; reduce the own block's part with every peer's
// slot, in rank order, into the output. Kernels: reducescatter_fullmesh_<dtype>_<op>(CollArgs),
// extra[0] = slot bytes C, extra[1] = bytes per rank.
#include "../mesh.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void fullmeshReduceScatter(const CollArgs& a) {
  const uint64_t C = a.extra[0], B = a.extra[1];
  const int rank = a.rank, n = a.nranks, blk = blockIdx.x;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  char* mine = plainOf(a, rank);
  __shared__ const char* srcs[kMaxRanks];
  for (uint64_t start = 0; start < B; start += C) {
    const uint64_t c = (B - start < C) ? B - start : C;
    uint64_t x0, x1;
    blockPart(c, gridDim.x, blk, x0, x1);
    meshBarrier(a, blk);
    for (int q = 1; q < n; ++q) {
      const int p = (rank + q) % n;
      blockCopy(plainOf(a, p) + (uint64_t)rank * C + x0, send + (uint64_t)p * B + start + x0, x1 - x0);
    }
    if (threadIdx.x < (unsigned)n) {
      const int r = threadIdx.x;
      srcs[r] = (r == rank) ? send + (uint64_t)rank * B + start + x0 : mine + (uint64_t)r * C + x0;
    }
    meshBarrier(a, blk);
    blockReduce<T, OP>(recv + start + x0, nullptr, 0, srcs, n, x1 - x0, n);
  }
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(reducescatter_fullmesh, mscclpp::coll::fullmeshReduceScatter)
