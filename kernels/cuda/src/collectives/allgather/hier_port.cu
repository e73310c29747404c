// All-gather hier_port (core/src/collectives/allgather/hier_port.rs has the protocol and the
// scratch layout; ../hier.hpp the shared pieces and arguments): per chunk of C bytes of every
// rank's input,
// A(k): every block copies its part of the own input's chunk into X slot (k mod D, node); grid
//       barrier; the rail threads put that slot (same offsets) to their rail peers, with a signal;
// B(k): the rail threads wait for their rail peers' chunks; grid barrier; (staged: every block
//       copies its part of the received slots into the shared buffer's;) local barrier (the local
//       peers' slots have landed too); every block copies its part of every local rank's N slots
//       (local rank r, node j: the chunk of rank (j, local index of r)) into the output; local
//       barrier (the slots are free again).
// Pipelined: A(0), then A(k + 1) before B(k). A local barrier and a handshake with the rail peers
// open the launch; a flush of the rail channels closes it.
// Kernel: allgather_hier_port(CollArgs), count = BYTES per rank (not elements), extra[2] = chunk
// bytes C.
// Scratch: X D x N x C, D = 4 (in the shared buffer; over Ethernet the network buffer's X slots are
// the rail channels' sources and targets, copied to and from the shared ones: see `staged`).
#include "../hier.hpp"

using namespace mscclpp;
using namespace mscclpp::coll;

extern "C" __global__ void __launch_bounds__(1024) allgather_hier_port(CollArgs a) {
  const HierTopo h = hierTopo(a);
  const uint64_t C = a.extra[2], N = (uint64_t)h.N;
  const uint64_t total = a.count;
  const uint64_t base = a.plainOffset;
  const uint64_t G = gridDim.x, b = blockIdx.x;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  char* mine = plainOf(a, a.rank);
  // The rail channels move X slots of the network buffer; when that is a separate (host-mapped)
  // buffer, the own chunk is written to both and the received slots are copied into the shared
  // one, where the local peers read them.
  char* net = netPlain(a);
  const bool staged = net != mine;
  PortChannelDeviceHandle* rail = railChannel(a, h);
  const uint32_t flag = blockFlag(a);
  uint32_t passed = 0;
  // Offset of X slot (k mod D, j) in the plain scratch, and bytes of chunk k.
  auto slot = [&](uint64_t k, uint64_t j) -> uint64_t { return ((k % kHierDepth) * N + j) * C; };
  auto len = [&](uint64_t k) -> uint64_t { return clipLen(total, k * C, C); };

  hierOpen(a, h, rail);

  auto stageA = [&](uint64_t k) {
    uint64_t x0, x1;
    blockPart(len(k), G, b, x0, x1);
    blockCopy(mine + slot(k, h.node) + x0, send + k * C + x0, x1 - x0);
    if (staged) blockCopy(net + slot(k, h.node) + x0, send + k * C + x0, x1 - x0);
    gridBarrier(flag, passed);
    if (rail != nullptr) {
      const uint64_t off = base + slot(k, h.node);
      putOrSignal(rail, off, off, len(k));
    }
  };

  auto stageB = [&](uint64_t k) {
    if (rail != nullptr) rail->wait();
    gridBarrier(flag, passed);
    uint64_t x0, x1;
    blockPart(len(k), G, b, x0, x1);
    if (staged) {
      for (int j = 0; j < h.N; ++j) {
        if (j != h.node) blockCopy(mine + slot(k, j) + x0, net + slot(k, j) + x0, x1 - x0);
      }
    }
    localBarrier(a, h);
    for (int q = 0; q < h.L; ++q) {
      const int l = (h.local + q) % h.L;
      const char* x = plainOf(a, h.rankAt(h.node, l));
      for (int j = 0; j < h.N; ++j) {
        const uint64_t owner = (uint64_t)h.rankAt(j, l);
        blockCopy(recv + owner * total + k * C + x0, x + slot(k, j) + x0, x1 - x0);
      }
    }
    localBarrier(a, h);
  };

  hierPipeline((total + C - 1) / C, stageA, stageB, rail);
  bumpFlags(a, flag);
}
