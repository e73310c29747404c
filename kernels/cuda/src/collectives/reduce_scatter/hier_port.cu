// Reduce-scatter hier_port (core/src/collectives/reduce_scatter/hier_port.rs has the protocol and
// the scratch layout; ../hier.hpp the shared pieces and arguments): per chunk of C bytes of every
// block (rank r's block = the input's r-th `count`-element part),
// A(k): 1. every block copies its part of the chunk of every input block into area A; local
//          barrier; 2. for every node j, every block reduces its part of the chunk of block
//          (j, local index) over the local ranks' A (local order) into R slot (k mod D, j), as
//          accumulators; local barrier (A free again); grid barrier; 3. the rail thread of the
//          rail peer on node j puts R slot (k mod D, j) into its NET slot (k mod D, node), with a
//          signal;
// B(k): the rail threads wait for their rail peers' partials; grid barrier; every block reduces
//       its part of the N partials of the own block (node order: R for the own node, NET for the
//       others) into the output (finished, rounded once).
// Pipelined: A(0), then A(k + 1) before B(k). A local barrier and a handshake with the rail peers
// open the launch; a flush of the rail channels closes it.
// Kernels: reducescatter_hier_port_<dtype>_<op>(CollArgs), extra[2] = chunk bytes C.
// Scratch: A n x C, R D x N x W, NET D x N x W; W = C x sizeof(Acc) / sizeof(T), D = 4.
// R and NET are in the network buffer (`netPlain`: host-mapped over Ethernet), A in the shared one.
#include "../hier.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void hierPortReduceScatter(const CollArgs& a) {
  using A = typename Elem<T>::Acc;
  constexpr uint64_t WID = HierWidths<T>::WID;
  const HierTopo h = hierTopo(a);
  const uint64_t C = a.extra[2], W = C * WID, N = (uint64_t)h.N, n = (uint64_t)a.nranks;
  const uint64_t total = a.count * sizeof(T);
  const uint64_t offR = n * C, offNet = offR + kHierDepth * N * W;
  const uint64_t base = a.plainOffset;
  const uint64_t G = gridDim.x, b = blockIdx.x;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  char* mine = plainOf(a, a.rank);
  char* net = netPlain(a);  // R and NET (only this rank reads them)
  PortChannelDeviceHandle* rail = railChannel(a, h);
  const uint32_t flag = blockFlag(a);
  uint32_t passed = 0;
  // Offsets of R / NET slot (k mod D, j) in the plain scratch, and bytes of chunk k.
  auto rSlot = [&](uint64_t k, uint64_t j) -> uint64_t { return offR + ((k % kHierDepth) * N + j) * W; };
  auto netSlot = [&](uint64_t k, uint64_t j) -> uint64_t { return offNet + ((k % kHierDepth) * N + j) * W; };
  auto len = [&](uint64_t k) -> uint64_t { return clipLen(total, k * C, C); };

  hierOpen(a, h, rail);

  auto stageA = [&](uint64_t k) {
    const uint64_t m = len(k);
    uint64_t x0, x1;
    blockPart(m, G, b, x0, x1);
    for (uint64_t blk = 0; blk < n; ++blk) {
      blockCopy(mine + blk * C + x0, send + blk * total + k * C + x0, x1 - x0);
    }
    localBarrier(a, h);
    for (int j = 0; j < h.N; ++j) {
      const uint64_t blk = (uint64_t)h.rankAt(j, h.local);
      auto src = [&](int l) -> const char* { return plainOf(a, h.rankAt(h.node, l)) + blk * C; };
      reduceToAcc<T, OP>(reinterpret_cast<A*>(net + rSlot(k, j)), src, h.L, m, x0, x1);
    }
    localBarrier(a, h);
    gridBarrier(flag, passed);
    if (rail != nullptr) {
      const uint64_t j = (uint64_t)h.railNode(threadIdx.x);
      putOrSignal(rail, base + netSlot(k, h.node), base + rSlot(k, j), m * WID);
    }
  };

  auto stageB = [&](uint64_t k) {
    if (rail != nullptr) rail->wait();
    gridBarrier(flag, passed);
    const uint64_t m = len(k);
    uint64_t x0, x1;
    blockPart(m, G, b, x0, x1);
    auto src = [&](int j) -> const A* {
      return reinterpret_cast<const A*>(net + (j == h.node ? rSlot(k, j) : netSlot(k, j)));
    };
    reduceFromAcc<T, OP>(recv + k * C, nullptr, src, h.N, m, x0, x1, a.nranks);
  };

  hierPipeline((total + C - 1) / C, stageA, stageB, rail);
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(reducescatter_hier_port, mscclpp::coll::hierPortReduceScatter)
