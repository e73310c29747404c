// Shared device pieces of the hierarchical (multi-node) collective kernels; the protocols are in
// core/src/collectives/allreduce/hier_rsag_port.rs, allgather/hier_port.rs and
// reduce_scatter/hier_port.rs (the host backend runs the same steps on one thread).
//
// Arguments common to the three (CollArgs.extra, written by `collectives::hier::gpu_args`):
//   extra[0]  PortChannelDeviceHandle table of the net (rail) channels, index = rank, in device
//             memory (0 on one node: there are no rail peers then)
//   extra[1]  u32[N][L] node-major rank table (meta buffer, `MetaLayout::node_ranks`)
//   extra[3]  L | N << 16 | local index << 32 | node << 48
//   extra[4]  device address of this rank's network buffer (`NetState::base`, core/src/collectives/
//             net.rs): the own shared buffer, or a host-mapped staging buffer of the same layout
//             (GPU ranks over Ethernet); 0 on one node. What the rail channels put from or into
//             lives there (`netPlain`); what local peers read stays in the shared buffer.
// (extra[2] is the algorithm's: the shard / chunk bytes.)
//
// Synchronisation: node-local barriers are per block, with the same block of every local peer
// (semaphore row blockIdx.x), so block b only depends on block b of its local peers: every
// intra-node phase partitions its bytes with `blockPart` of the same lengths on every rank.
// The net port channels are driven by the rail threads (block 0, thread i for rail peer i, the
// rank of this local index on node (node + 1 + i) mod N); grid barriers order the rail threads'
// puts after every block wrote the sources, and every block's reads after the rail threads'
// waits. Every spin (semaphores, FIFO, grid barrier) is bounded (MSCCLPP_SPIN_UNTIL): a peer
// that never arrives ends the kernel with a message instead of hanging it.
#ifndef MSCCLPP_COLLECTIVES_HIER_HPP_
#define MSCCLPP_COLLECTIVES_HIER_HPP_

#include <mscclpp/port_channel_device.hpp>

#include "mesh.hpp"

namespace mscclpp {
namespace coll {

/// Pipeline slots (`collectives::hier::DEPTH`).
constexpr uint64_t kHierDepth = 4;

/// The node layout of the launch.
struct HierTopo {
  const uint32_t* nodeRanks;
  int L;      // ranks per node
  int N;      // nodes
  int local;  // this rank's local index
  int node;   // this rank's node

  /// The rank of local index l on node m.
  MSCCLPP_DEVICE_INLINE int rankAt(int m, int l) const { return (int)nodeRanks[(uint64_t)m * L + l]; }
  /// Node of rail peer i (0 <= i < N - 1).
  MSCCLPP_DEVICE_INLINE int railNode(int i) const { return (node + 1 + i) % N; }
};

MSCCLPP_DEVICE_INLINE HierTopo hierTopo(const CollArgs& a) {
  HierTopo h;
  h.nodeRanks = reinterpret_cast<const uint32_t*>(a.extra[1]);
  const uint64_t p = a.extra[3];
  h.L = (int)(p & 0xffff);
  h.N = (int)((p >> 16) & 0xffff);
  h.local = (int)((p >> 32) & 0xffff);
  h.node = (int)((p >> 48) & 0xffff);
  return h;
}

/// Block handshake with the same block of every local peer (see meshBarrier): everything this
/// block wrote before is visible to the local peers' block, and everything they wrote before their
/// handshake is visible here, when it returns. Needs blockDim.x >= L.
MSCCLPP_DEVICE_INLINE void localBarrier(const CollArgs& a, const HierTopo& h) {
  __syncthreads();
  const int l = threadIdx.x;
  if (l < h.L && l != h.local) {
    MemoryDevice2DeviceSemaphoreDeviceHandle& s = meshSem(a, blockIdx.x, h.rankAt(h.node, l));
    s.signal();
    s.wait();
  }
  __syncthreads();
}

/// The plain scratch of this rank's network buffer (extra[4]; the shared buffer's on one node).
/// Host-mapped staging is read and written over PCIe with ordinary loads and stores: the grid
/// barriers' system-scope fences order them against the rail threads' FIFO pushes and waits.
MSCCLPP_DEVICE_INLINE char* netPlain(const CollArgs& a) {
  return a.extra[4] != 0 ? reinterpret_cast<char*>(a.extra[4]) + a.plainOffset : plainOf(a, a.rank);
}

/// The channel this thread drives (block 0, thread i < N - 1: rail peer i), or null.
MSCCLPP_DEVICE_INLINE PortChannelDeviceHandle* railChannel(const CollArgs& a, const HierTopo& h) {
  if (blockIdx.x != 0 || (int)threadIdx.x >= h.N - 1) return nullptr;
  const int peer = h.rankAt(h.railNode(threadIdx.x), h.local);
  return reinterpret_cast<PortChannelDeviceHandle*>(a.extra[0]) + peer;
}

/// The opening of every call: a node barrier, then a handshake with the rail peer (the rail
/// threads: `rail` is null elsewhere), as `collectives::hier::rail_handshake`.
MSCCLPP_DEVICE_INLINE void hierOpen(const CollArgs& a, const HierTopo& h, PortChannelDeviceHandle* rail) {
  localBarrier(a, h);
  if (rail != nullptr) {
    rail->signal();
    rail->wait();
  }
}

/// The pipeline over `chunks` chunks (`collectives::hier::host_pipeline`): stage A of chunk k + 1
/// runs before stage B of chunk k; then the rail channel is flushed.
template <typename StageA, typename StageB>
MSCCLPP_DEVICE_INLINE void hierPipeline(uint64_t chunks, StageA& stageA, StageB& stageB,
                                        PortChannelDeviceHandle* rail) {
  if (chunks > 0) stageA(0);
  for (uint64_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) stageA(k + 1);
    stageB(k);
  }
  if (rail != nullptr) rail->flush();
}

/// putWithSignal of `len` bytes, or only a signal when there is nothing to put (`put_or_signal`).
MSCCLPP_DEVICE_INLINE void putOrSignal(PortChannelDeviceHandle* c, uint64_t dst, uint64_t src, uint64_t len) {
  if (len > 0) {
    c->putWithSignal(dst, src, len);
  } else {
    c->signal();
  }
}

/// Bytes of a piece of at most `cap` bytes at `at` of a `total`-byte buffer (0 past its end).
MSCCLPP_DEVICE_INLINE uint64_t clipLen(uint64_t total, uint64_t at, uint64_t cap) {
  return at >= total ? 0 : (total - at < cap ? total - at : cap);
}

/// Elements of T per 16-byte vector, and accumulator bytes per element byte (`widen`).
template <typename T>
struct HierWidths {
  using A = typename Elem<T>::Acc;
  static constexpr int NT = 16 / sizeof(T);
  static constexpr uint64_t WID = sizeof(A) / sizeof(T);
};

/// The NT accumulators of one vector of T as whole 16-byte words (WID of them), so slots in
/// host-mapped memory (the network buffer over Ethernet) see 16-byte PCIe accesses instead of one
/// per accumulator.
template <typename T>
union AccWords {
  typename Elem<T>::Acc a[HierWidths<T>::NT];
  uint4 w[HierWidths<T>::WID];
};

/// Stage 1 reduction: for the bytes [x0, x1) of an `n`-byte piece (x0 a multiple of 16, x1 <= n),
/// acc = srcs[0] op ... op srcs[ns - 1] in the accumulation type, stored as accumulators (vector v
/// of T -> accumulators [v NT, (v + 1) NT) of `dst`, whole vectors stored as 16-byte words: `dst`
/// is 16-byte aligned and has room up to the piece's capacity rounded up to 16 bytes of T).
/// `src(i)` gives source i (16-byte aligned).
template <typename T, int OP, typename Src>
MSCCLPP_DEVICE_INLINE void reduceToAcc(typename Elem<T>::Acc* dst, Src src, int ns, uint64_t n, uint64_t x0,
                                       uint64_t x1) {
  using V = uint4;
  constexpr int NT = HierWidths<T>::NT;
  for (uint64_t v = x0 / 16 + threadIdx.x; v * 16 < x1; v += blockDim.x) {
    AccPack<T, V> acc;
    acc.load(loadWord<V>(src(0), v, n));
    for (int i = 1; i < ns; ++i) acc.template add<OP>(loadWord<V>(src(i), v, n));
    AccWords<T> u;
#pragma unroll
    for (int e = 0; e < NT; ++e) u.a[e] = acc.a[e];
    uint4* d = reinterpret_cast<uint4*>(dst + v * NT);  // v x 16 x WID bytes into dst: aligned
#pragma unroll
    for (uint64_t w = 0; w < HierWidths<T>::WID; ++w) d[w] = u.w[w];
  }
}

/// Stage 2 reduction: for the bytes [x0, x1) of an `n`-byte piece, the accumulators of srcs
/// 0..ns-1 (laid out as reduceToAcc stores them) combined in source order, finished (avg divides
/// by nranks) and rounded once to T, stored to out (any alignment) and, when not null, to out2
/// (both clipped at n).
template <typename T, int OP, typename Src>
MSCCLPP_DEVICE_INLINE void reduceFromAcc(char* out, char* out2, Src src, int ns, uint64_t n, uint64_t x0, uint64_t x1,
                                         int nranks) {
  using V = uint4;
  using A = typename Elem<T>::Acc;
  constexpr int NT = HierWidths<T>::NT;
  for (uint64_t v = x0 / 16 + threadIdx.x; v * 16 < x1; v += blockDim.x) {
    constexpr uint64_t WID = HierWidths<T>::WID;
    A acc[NT];
    AccWords<T> u;
    const uint4* s0 = reinterpret_cast<const uint4*>(src(0) + v * NT);
#pragma unroll
    for (uint64_t w = 0; w < WID; ++w) u.w[w] = s0[w];
#pragma unroll
    for (int e = 0; e < NT; ++e) acc[e] = u.a[e];
    for (int i = 1; i < ns; ++i) {
      const uint4* si = reinterpret_cast<const uint4*>(src(i) + v * NT);
#pragma unroll
      for (uint64_t w = 0; w < WID; ++w) u.w[w] = si[w];
#pragma unroll
      for (int e = 0; e < NT; ++e) acc[e] = combine<OP>(acc[e], u.a[e]);
    }
    Pack<T, V> p;
#pragma unroll
    for (int e = 0; e < NT; ++e) p.v[e] = Elem<T>::down(finish<OP>(acc[e], nranks));
    storeWord<V>(out, v, n, p.w);
    if (out2 != nullptr) storeWord<V>(out2, v, n, p.w);
  }
}

}  // namespace coll
}  // namespace mscclpp

#endif  // MSCCLPP_COLLECTIVES_HIER_HPP_
