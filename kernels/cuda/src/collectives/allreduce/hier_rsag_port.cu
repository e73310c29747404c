// All-reduce hier_rsag_port (core/src/collectives/allreduce/hier_rsag_port.rs has the protocol and
// the scratch layout; ../hier.hpp the shared pieces and arguments): per chunk of L x S bytes,
// A(k): 1. every block copies its part of every shard of the chunk into scratch area A; local
//          barrier; 2. every block reduces its part of the own shard (local index l) over the local
//          ranks' A (local order) into R slot k mod D, as accumulators; local barrier (A free
//          again); grid barrier; 3. the rail threads put R's slot into NET slot (k mod D, node) of
//          their rail peers, with a signal;
// B(k): 1. the rail threads wait for their rail peers' partials; grid barrier; 2. every block
//          reduces its part of the N partials (node order: R's slot for the own node, NET's
//          slots for the others) into the output and area F (finished, rounded once); local
//          barrier; 3. every block copies its part of the local peers' F into the output; local
//          barrier (F free again).
// Pipelined: A(0), then A(k + 1) before B(k). A local barrier and a handshake with the rail peers
// open the launch; a flush of the rail channels closes it.
// Kernels: allreduce_hier_rsag_port_<dtype>_<op>(CollArgs), extra[2] = shard bytes S.
// Scratch: A L x S, R D x W, NET D x N x W, F S; W = S x sizeof(Acc) / sizeof(T), D = 4. R and NET
// are in the network buffer (`netPlain`: host-mapped over Ethernet), A and F in the shared one.
#include "../hier.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void hierRsagPortAllreduce(const CollArgs& a) {
  using A = typename Elem<T>::Acc;
  constexpr uint64_t WID = HierWidths<T>::WID;
  const HierTopo h = hierTopo(a);
  const uint64_t S = a.extra[2], W = S * WID, L = (uint64_t)h.L, N = (uint64_t)h.N;
  const uint64_t total = a.count * sizeof(T);
  const uint64_t offR = L * S, offNet = offR + kHierDepth * W, offF = offNet + kHierDepth * N * W;
  const uint64_t base = a.plainOffset;  // channel offsets are from the shared buffers' starts
  const uint64_t G = gridDim.x, b = blockIdx.x;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  char* mine = plainOf(a, a.rank);
  char* net = netPlain(a);  // R and NET (only this rank reads them)
  PortChannelDeviceHandle* rail = railChannel(a, h);
  const uint32_t flag = blockFlag(a);
  uint32_t passed = 0;
  // Offset in the buffers and bytes of shard l of chunk k.
  auto at = [&](uint64_t k, uint64_t l) -> uint64_t { return (k * L + l) * S; };
  auto len = [&](uint64_t k, uint64_t l) -> uint64_t { return clipLen(total, at(k, l), S); };

  hierOpen(a, h, rail);

  auto stageA = [&](uint64_t k) {
    uint64_t x0, x1;
    for (uint64_t l = 0; l < L; ++l) {
      blockPart(len(k, l), G, b, x0, x1);
      blockCopy(mine + l * S + x0, send + at(k, l) + x0, x1 - x0);
    }
    localBarrier(a, h);
    const uint64_t n = len(k, h.local), slot = k % kHierDepth;
    blockPart(n, G, b, x0, x1);
    A* r = reinterpret_cast<A*>(net + offR + slot * W);
    auto src = [&](int l) -> const char* { return plainOf(a, h.rankAt(h.node, l)) + (uint64_t)h.local * S; };
    reduceToAcc<T, OP>(r, src, h.L, n, x0, x1);
    localBarrier(a, h);
    gridBarrier(flag, passed);
    if (rail != nullptr) {
      putOrSignal(rail, base + offNet + (slot * N + h.node) * W, base + offR + slot * W, n * WID);
    }
  };

  auto stageB = [&](uint64_t k) {
    if (rail != nullptr) rail->wait();
    gridBarrier(flag, passed);
    const uint64_t n = len(k, h.local), slot = k % kHierDepth;
    uint64_t x0, x1;
    blockPart(n, G, b, x0, x1);
    auto src = [&](int j) -> const A* {
      const uint64_t off = (j == h.node) ? offR + slot * W : offNet + (slot * N + j) * W;
      return reinterpret_cast<const A*>(net + off);
    };
    reduceFromAcc<T, OP>(recv + at(k, h.local), mine + offF, src, h.N, n, x0, x1, a.nranks);
    localBarrier(a, h);
    for (int q = 1; q < h.L; ++q) {
      const int l = (h.local + q) % h.L;
      blockPart(len(k, l), G, b, x0, x1);
      blockCopy(recv + at(k, l) + x0, plainOf(a, h.rankAt(h.node, l)) + offF + x0, x1 - x0);
    }
    localBarrier(a, h);
  };

  hierPipeline((total + L * S - 1) / (L * S), stageA, stageB, rail);
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_hier_rsag_port, mscclpp::coll::hierRsagPortAllreduce)
