// Broadcast packet (core/src/collectives/broadcast/packet.rs has the protocol): the root writes its
// buffer as LL16 packets into region `root` of every peer's LL half (every warp of every block
// sends) and, out of place, copies it into its own output; every other rank unpacks the root's
// region into its output. Notes: each rank other than the root writes one packet per block into
// region `rank` of every other rank's LL half when it enters the launch, and each block waits for
// the notes of the same block of every other rank but the root (whose packets say so) before it
// ends. So a rank that finished this launch knows that every rank has entered it, as the one-hop
// exchanges know from their peers' packets: a later launch may write into their LL halves of
// two launches ago. One hop, for small messages. Block b owns the 32-word stripes
// `(idx / 32) % gridDim.x == b`; its notes are word `b * 32` of the writer's region.
// Kernel: broadcast_packet(CollArgs), extra[0] = 8-byte words, extra[1] = bytes.
#include "../common.hpp"

using namespace mscclpp;
using namespace mscclpp::coll;

extern "C" __global__ void __launch_bounds__(1024) broadcast_packet(CollArgs a) {
  using P = LL16Packet;
  using W = P::Payload;
  const uint64_t nWords = a.extra[0], B = a.extra[1];
  const int rank = a.rank, n = a.nranks, root = a.root;
  const uint32_t flag = blockFlag(a);
  const uint64_t note = (uint64_t)blockIdx.x * kWarp;
  const int t = (int)threadIdx.x;
  // The launch gives every block a stripe, so its note's word lies inside the region (blocks of a
  // wider grid would own nothing and neither write nor wait for notes).
  const bool notes = note < nWords && t < n && t != rank;
  if (notes && rank != root) {
    W zero;
    memset(&zero, 0, sizeof(zero));
    P* at = reinterpret_cast<P*>(llHalf(a, a.peerBases[t], flag)) + (uint64_t)rank * nWords + note;
    at->write(zero, flag);
  }
  P* mine = reinterpret_cast<P*>(llHalf(a, a.peerBases[rank], flag));
  if (rank == root) {
    llSendToPeers<P>(a, flag, nWords, B, [&](int) { return a.send; });
    if (a.send != a.recv) llCopyOwnWords<W>(a.recv, a.send, nWords, B);
  } else {
    const P* from = mine + (uint64_t)root * nWords;
    for (uint64_t idx = llFirstWord(); idx < nWords; idx += llWordStep()) {
      storeWord<W>(a.recv, idx, B, from[idx].read(flag));
    }
  }
  if (notes && t != root) (void)mine[(uint64_t)t * nWords + note].read(flag);
  bumpFlags(a, flag);
}
