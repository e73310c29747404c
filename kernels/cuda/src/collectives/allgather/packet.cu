// All-gather packet (core/src/collectives/allgather/packet.rs has the protocol): every rank
// writes its input as LL16 packets into region `rank` of every peer's LL half (every warp of
// every block sends) and, out of place, copies it into its own output slot; then every warp unpacks
// the peers' regions into their output slots. One hop, for small messages.
// Block b owns the 32-word stripes `(idx / 32) % gridDim.x == b` for sending and unpacking, so a
// block only waits for the same block of its peers. In place the input is the own output slot,
// which nothing here writes.
// Kernel: allgather_packet(CollArgs), extra[0] = 8-byte words per rank, extra[1] = bytes per rank.
#include "../common.hpp"

using namespace mscclpp;
using namespace mscclpp::coll;

extern "C" __global__ void __launch_bounds__(1024) allgather_packet(CollArgs a) {
  using P = LL16Packet;
  using W = P::Payload;
  const uint64_t nWords = a.extra[0], B = a.extra[1];
  const int rank = a.rank, n = a.nranks;
  const uint32_t flag = blockFlag(a);
  char* recv = reinterpret_cast<char*>(a.recv);
  char* own = recv + (uint64_t)rank * B;
  const bool inPlace = a.send == own;
  llSendToPeers<P>(a, flag, nWords, B, [&](int) { return a.send; });
  if (!inPlace) llCopyOwnWords<W>(own, a.send, nWords, B);
  const P* mine = reinterpret_cast<const P*>(llHalf(a, a.peerBases[rank], flag));
  for (uint64_t idx = llFirstWord(); idx < nWords; idx += llWordStep()) {
    for (int q = 1; q < n; ++q) {
      const int r = (rank + q) % n;
      storeWord<W>(recv + (uint64_t)r * B, idx, B, mine[(uint64_t)r * nWords + idx].read(flag));
    }
  }
  bumpFlags(a, flag);
}
