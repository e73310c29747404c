// Broadcast fullmesh (core/src/collectives/broadcast/fullmesh.rs has the protocol): per chunk of C
// bytes, each block (its vector part of the chunk): root and every peer shake hands (semaphore row
// = block); the root writes its part into every peer's plain scratch (and its own output when out
// of place) and signals; a peer waits, then copies the part into its output.
// Kernel: broadcast_fullmesh(CollArgs), extra[0] = chunk bytes C, extra[1] = bytes.
#include "../mesh.hpp"

using namespace mscclpp;
using namespace mscclpp::coll;

extern "C" __global__ void __launch_bounds__(1024) broadcast_fullmesh(CollArgs a) {
  const uint64_t C = a.extra[0], B = a.extra[1];
  const int rank = a.rank, n = a.nranks, root = a.root, blk = blockIdx.x;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  __shared__ char* dsts[kMaxRanks];
  const int t = threadIdx.x;
  for (uint64_t start = 0; start < B; start += C) {
    const uint64_t c = (B - start < C) ? B - start : C;
    uint64_t x0, x1;
    blockPart(c, gridDim.x, blk, x0, x1);
    __syncthreads();
    if (rank == root) {
      if (t < n && t != rank) {
        MemoryDevice2DeviceSemaphoreDeviceHandle& s = meshSem(a, blk, t);
        s.signal();
        s.wait();
      }
      int nd = 0;
      for (int q = 1; q < n; ++q) {
        const int p = (rank + q) % n;
        if (t == 0) dsts[nd] = plainOf(a, p) + x0;
        ++nd;
      }
      if (send != recv) {
        if (t == 0) dsts[nd] = recv + start + x0;
        ++nd;
      }
      __syncthreads();
      blockCopyMulti(dsts, nd, send + start + x0, x1 - x0);
      __syncthreads();
      if (t < n && t != rank) meshSem(a, blk, t).signal();
    } else {
      if (t == 0) {
        MemoryDevice2DeviceSemaphoreDeviceHandle& s = meshSem(a, blk, root);
        s.signal();
        s.wait();
        s.wait();
      }
      __syncthreads();
      blockCopy(recv + start + x0, plainOf(a, rank) + x0, x1 - x0);
    }
  }
}
