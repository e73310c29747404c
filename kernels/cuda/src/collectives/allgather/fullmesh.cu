// All-gather fullmesh (core/src/collectives/allgather/fullmesh.rs has the protocol): per chunk
// of C bytes of every rank's input, each block (its vector part of the chunk): handshake with the
// same block of every peer; write the part into slot `rank` of every peer's plain scratch (and
// into the own output when out of place); handshake; copy the part of every peer's slot into the
// output. Kernel: allgather_fullmesh(CollArgs), extra[0] = slot bytes C, extra[1] = bytes per rank.
#include "../mesh.hpp"

using namespace mscclpp;
using namespace mscclpp::coll;

extern "C" __global__ void __launch_bounds__(1024) allgather_fullmesh(CollArgs a) {
  const uint64_t C = a.extra[0], B = a.extra[1];
  const int rank = a.rank, n = a.nranks, blk = blockIdx.x;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  char* own = recv + (uint64_t)rank * B;
  const bool inPlace = send == own;
  char* mine = plainOf(a, rank);
  __shared__ char* dsts[kMaxRanks];
  for (uint64_t start = 0; start < B; start += C) {
    const uint64_t c = (B - start < C) ? B - start : C;
    uint64_t x0, x1;
    blockPart(c, gridDim.x, blk, x0, x1);
    meshBarrier(a, blk);
    int nd = 0;
    for (int q = 1; q < n; ++q) {
      const int p = (rank + q) % n;
      if (threadIdx.x == 0) dsts[nd] = plainOf(a, p) + (uint64_t)rank * C + x0;
      ++nd;
    }
    if (!inPlace) {
      if (threadIdx.x == 0) dsts[nd] = own + start + x0;
      ++nd;
    }
    __syncthreads();
    blockCopyMulti(dsts, nd, send + start + x0, x1 - x0);
    meshBarrier(a, blk);
    for (int q = 1; q < n; ++q) {
      const int p = (rank + q) % n;
      blockCopy(recv + (uint64_t)p * B + start + x0, mine + (uint64_t)p * C + x0, x1 - x0);
    }
  }
}
