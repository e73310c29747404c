// Zero-copy push of all-gather and broadcast (core/src/collectives/zero_copy.rs has the protocol):
// every rank's output is registered and mapped here. Each block (its vector part of the B bytes):
// handshake with the same block of every peer; when this rank pushes, copy the part of the input
// into every rank's output at the same offset (remote 16-byte stores; the own output is skipped
// when it is the input itself); handshake. All-gather: every rank pushes to offset rank * B;
// broadcast: the root pushes to offset 0, the others only take part in the handshakes.
// Kernel: allgather_zero_copy(CollArgs) (one kernel for every type), extra[0] = u64[nranks] of the
// outputs mapped here (their registrations' starts), extra[1] = B, extra[2] = the offset in every
// output, extra[3] = 1 when this rank pushes, extra[4] = where the outputs start in their
// registrations (a view, the same on every rank; 0 for the registrations themselves).
#include "../mesh.hpp"

using namespace mscclpp;
using namespace mscclpp::coll;

extern "C" __global__ void __launch_bounds__(1024) allgather_zero_copy(CollArgs a) {
  const uint64_t* outs = reinterpret_cast<const uint64_t*>(a.extra[0]);
  const uint64_t B = a.extra[1], at = a.extra[2], view = a.extra[4];
  const bool push = a.extra[3] != 0;
  const int rank = a.rank, n = a.nranks, blk = blockIdx.x;
  uint64_t x0, x1;
  blockPart(B, gridDim.x, blk, x0, x1);
  const char* src = reinterpret_cast<const char*>(a.send) + x0;
  char* own = reinterpret_cast<char*>(a.recv) + at + x0;
  __shared__ char* dsts[kMaxRanks];
  if (threadIdx.x < (unsigned)n) {
    const int r = threadIdx.x;
    // dsts[0..n-1): the peers' outputs, in the order after this rank; dsts[n-1]: the own.
    if (r != rank) dsts[(r - rank - 1 + n) % n] = reinterpret_cast<char*>(outs[r]) + view + at + x0;
    if (r == rank) dsts[n - 1] = own;
  }
  meshBarrier(a, blk);
  if (push) blockCopyMulti(dsts, own == src ? n - 1 : n, src, x1 - x0);
  meshBarrier(a, blk);
}
