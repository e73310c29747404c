// Shared device pieces of the scratch-based ("mesh") collective kernels (core/src/collectives/mesh.rs
// is the host side): block handshakes on the per-(block, peer) semaphores, the block partition of a
// chunk, block-wide copies (to one or several destinations, any alignment; 16-byte vectors with 4
// loads in flight per thread when aligned), the block-wide reduction of n sources in rank order,
// and a grid barrier for kernels whose blocks must all finish a phase.
#ifndef MSCCLPP_COLLECTIVES_MESH_HPP_
#define MSCCLPP_COLLECTIVES_MESH_HPP_

#include "common.hpp"

namespace mscclpp {
namespace coll {

constexpr uint64_t kVec = 16;
/// The most ranks the mesh kernels address (shared-memory tables of peer pointers).
constexpr int kMaxRanks = 64;

MSCCLPP_DEVICE_INLINE MemoryDevice2DeviceSemaphoreDeviceHandle& meshSem(const CollArgs& a, int blk, int peer) {
  return a.sems[(uint64_t)blk * a.nranks + peer];
}

/// Rank r's plain scratch, as mapped here.
MSCCLPP_DEVICE_INLINE char* plainOf(const CollArgs& a, int r) {
  return reinterpret_cast<char*>(a.peerBases[r]) + a.plainOffset;
}

/// Block handshake with the same block (semaphore row `blk`) of every peer: everything this block
/// wrote before is visible to the peers, and everything they wrote before their handshake is
/// visible here, when it returns. Needs blockDim.x >= nranks.
MSCCLPP_DEVICE_INLINE void meshBarrier(const CollArgs& a, int blk) {
  __syncthreads();
  const int p = threadIdx.x;
  if (p < a.nranks && p != a.rank) {
    MemoryDevice2DeviceSemaphoreDeviceHandle& s = meshSem(a, blk, p);
    s.signal();
    s.wait();
  }
  __syncthreads();
}

/// [x0, x1): the bytes block b of nb owns in a chunk of c bytes (whole vectors, clipped at c).
MSCCLPP_DEVICE_INLINE void blockPart(uint64_t c, uint64_t nb, uint64_t b, uint64_t& x0, uint64_t& x1) {
  const uint64_t nv = (c + kVec - 1) / kVec;
  const uint64_t per = nv / nb, rem = nv % nb;
  const uint64_t v0 = b * per + (b < rem ? b : rem);
  const uint64_t v1 = v0 + per + (b < rem ? 1 : 0);
  x0 = v0 * kVec < c ? v0 * kVec : c;
  x1 = v1 * kVec < c ? v1 * kVec : c;
}

/// All threads of the block copy `bytes` from src to the nd destinations dsts[0..nd) (src read once).
MSCCLPP_DEVICE_INLINE void blockCopyMulti(char* const* dsts, int nd, const char* src, uint64_t bytes) {
  uintptr_t bits = (uintptr_t)src;
  for (int d = 0; d < nd; ++d) bits |= (uintptr_t)dsts[d];
  const uint64_t stride = blockDim.x;
  uint64_t done = 0;
  if ((bits & 15) == 0) {
    const uint64_t nv = bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint64_t i = threadIdx.x;
    for (; i + 3 * stride < nv; i += 4 * stride) {
      uint4 r[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) r[u] = s[i + u * stride];
      for (int d = 0; d < nd; ++d) {
        uint4* o = reinterpret_cast<uint4*>(dsts[d]);
#pragma unroll
        for (int u = 0; u < 4; ++u) o[i + u * stride] = r[u];
      }
    }
    for (; i < nv; i += stride) {
      const uint4 r = s[i];
      for (int d = 0; d < nd; ++d) reinterpret_cast<uint4*>(dsts[d])[i] = r;
    }
    done = nv * 16;
  } else if ((bits & 3) == 0) {
    const uint64_t nw = bytes / 4;
    const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
    for (uint64_t i = threadIdx.x; i < nw; i += stride) {
      const uint32_t r = s[i];
      for (int d = 0; d < nd; ++d) reinterpret_cast<uint32_t*>(dsts[d])[i] = r;
    }
    done = nw * 4;
  }
  for (uint64_t i = done + threadIdx.x; i < bytes; i += stride) {
    const char r = src[i];
    for (int d = 0; d < nd; ++d) dsts[d][i] = r;
  }
}

/// All threads of the block copy `bytes` from src to dst.
MSCCLPP_DEVICE_INLINE void blockCopy(char* dst, const char* src, uint64_t bytes) {
  char* const d[1] = {dst};
  blockCopyMulti(d, 1, src, bytes);
}

/// out = srcs[0] op srcs[1] op ... op srcs[n-1] (then avg's division) over `bytes` bytes, in 16-byte
/// words (a partial last word is zero padded on loading and stored up to `bytes`); any alignment.
/// Also stores the result to the nd extra destinations outs[0..nd). When every pointer is 16-byte
/// aligned, each thread keeps 4 words of every source in flight.
template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void blockReduce(char* out, char* const* outs, int nd, const char* const* srcs, int n,
                                       uint64_t bytes, int nranks) {
  using V = uint4;
  constexpr int U = 4;
  const uint64_t nv = (bytes + kVec - 1) / kVec;
  const uint64_t stride = blockDim.x;
  uintptr_t bits = (uintptr_t)out;
  for (int d = 0; d < nd; ++d) bits |= (uintptr_t)outs[d];
  for (int r = 0; r < n; ++r) bits |= (uintptr_t)srcs[r];
  const uint64_t nvFull = (bits & 15) == 0 ? bytes / kVec : 0;
  uint64_t v = threadIdx.x;
  for (; v + (U - 1) * stride < nvFull; v += U * stride) {
    AccPack<T, V> acc[U];
    V x[U];
    const V* s0 = reinterpret_cast<const V*>(srcs[0]);
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = s0[v + u * stride];
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u].load(x[u]);
    for (int r = 1; r < n; ++r) {
      const V* sr = reinterpret_cast<const V*>(srcs[r]);
#pragma unroll
      for (int u = 0; u < U; ++u) x[u] = sr[v + u * stride];
#pragma unroll
      for (int u = 0; u < U; ++u) acc[u].template add<OP>(x[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const V res = acc[u].template store<OP>(nranks);
      reinterpret_cast<V*>(out)[v + u * stride] = res;
      for (int d = 0; d < nd; ++d) reinterpret_cast<V*>(outs[d])[v + u * stride] = res;
    }
  }
  for (; v < nv; v += stride) {
    AccPack<T, V> acc;
    acc.load(loadWord<V>(srcs[0], v, bytes));
    for (int r = 1; r < n; ++r) acc.template add<OP>(loadWord<V>(srcs[r], v, bytes));
    const V res = acc.template store<OP>(nranks);
    storeWord<V>(out, v, bytes, res);
    for (int d = 0; d < nd; ++d) storeWord<V>(outs[d], v, bytes, res);
  }
}

/// The word of the grid barrier: flag << 32 | blocks arrived in this launch (flag: the launch's LL
/// flag, unique per launch, so the word never needs resetting).
__device__ unsigned long long meshGridWord;

/// Grid barrier number `passed` of this launch (then ++passed): every block of the grid calls the
/// same sequence, and all blocks must be resident at once (small grids). Writes of every block
/// before it are visible to every block after it.
MSCCLPP_DEVICE_INLINE void gridBarrier(uint32_t flag, uint32_t& passed) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    const unsigned long long tag = (unsigned long long)flag << 32;
    unsigned long long seen = loadRelaxedSys(reinterpret_cast<uint64_t*>(&meshGridWord));
    for (;;) {
      const unsigned long long next = ((seen >> 32) == flag) ? seen + 1 : (tag | 1ull);
      const unsigned long long old = atomicCAS(&meshGridWord, seen, next);
      if (old == seen) break;
      seen = old;
    }
    const unsigned long long target = tag | ((unsigned long long)(passed + 1) * gridDim.x);
    MSCCLPP_SPIN_UNTIL(loadAcquireSys(reinterpret_cast<uint64_t*>(&meshGridWord)) >= target, -1, "grid barrier");
    __threadfence_system();
  }
  ++passed;
  __syncthreads();
}

}  // namespace coll
}  // namespace mscclpp

#endif  // MSCCLPP_COLLECTIVES_MESH_HPP_
