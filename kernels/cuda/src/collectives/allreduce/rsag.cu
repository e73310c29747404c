// All-reduce rsag (core/src/collectives/allreduce/rsag.rs has the protocol): per chunk of the
// input that fits the plain scratch, 1. copy this block's part of every slice into the own
// scratch, barrier with the same block of every peer; 2. reduce this block's part of the own
// slice from every rank's scratch (remote 16-byte reads, rank order), store it into the output
// and every peer's scratch; barrier; 3. copy the other slices' parts from the own scratch to the
// output. Semaphore (block, peer) = sems[block * nranks + peer].
// Kernels: allreduce_rsag_<dtype>_<op>(CollArgs), extra[0] = elements per chunk.
#include "../common.hpp"

namespace mscclpp {
namespace coll {

MSCCLPP_DEVICE_INLINE void blockBarrier(const CollArgs& a) {
  __syncthreads();
  const int p = threadIdx.x;
  if (p < a.nranks && p != a.rank) {
    MemoryDevice2DeviceSemaphoreDeviceHandle& s = a.sems[(uint64_t)blockIdx.x * a.nranks + p];
    s.signal();
    s.wait();
  }
  __syncthreads();
}

/// [begin, end) of part i of n items split into parts near-equal parts (algorithm.rs `split`).
MSCCLPP_DEVICE_INLINE void splitRange(uint64_t n, uint64_t parts, uint64_t i, uint64_t& b, uint64_t& e) {
  const uint64_t per = n / parts, rem = n % parts;
  b = i * per + (i < rem ? i : rem);
  e = b + per + (i < rem ? 1 : 0);
}

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void rsagAllreduce(const CollArgs& a) {
  using V = uint4;
  constexpr uint64_t EPV = 16 / sizeof(T);
  const int rank = a.rank, n = a.nranks;
  const uint64_t chunk = a.extra[0];
  char* scratch = reinterpret_cast<char*>(a.peerBases[rank]) + a.plainOffset;
  for (uint64_t start = 0; start < a.count; start += chunk) {
    const uint64_t cnt = (a.count - start < chunk) ? a.count - start : chunk;
    const uint64_t s = ((cnt + n - 1) / n + EPV - 1) / EPV * EPV;  // elements per slice
    const uint64_t sv = s / EPV;                                   // vectors per slice
    uint64_t v0, v1;
    splitRange(sv, gridDim.x, blockIdx.x, v0, v1);
    const uint64_t bytes = cnt * sizeof(T);
    const char* send = reinterpret_cast<const char*>(a.send) + start * sizeof(T);
    char* recv = reinterpret_cast<char*>(a.recv) + start * sizeof(T);
    const uint64_t nv = v1 - v0;
    // 1. input -> own scratch (this block's part of every slice).
    for (uint64_t i = threadIdx.x; i < nv * n; i += blockDim.x) {
      const uint64_t v = (uint64_t)(i / nv) * sv + v0 + i % nv;
      if (v * 16 >= bytes) continue;
      reinterpret_cast<V*>(scratch)[v] = loadWord<V>(send, v, bytes);
    }
    blockBarrier(a);
    // 2. reduce the own slice, store it locally and into every peer's scratch.
    for (uint64_t i = threadIdx.x; i < nv; i += blockDim.x) {
      const uint64_t v = (uint64_t)rank * sv + v0 + i;
      if (v * 16 >= bytes) continue;
      AccPack<T, V> acc;
      for (int r = 0; r < n; ++r) {
        const V x = reinterpret_cast<const V*>(reinterpret_cast<const char*>(a.peerBases[r]) + a.plainOffset)[v];
        acc.template fold<OP>(r, x);
      }
      const V res = acc.template store<OP>(n);
      storeWord<V>(recv, v, bytes, res);
      for (int q = 0; q < n - 1; ++q) {
        const int p = (rank + 1 + q) % n;
        reinterpret_cast<V*>(reinterpret_cast<char*>(a.peerBases[p]) + a.plainOffset)[v] = res;
      }
    }
    blockBarrier(a);
    // 3. the other slices: own scratch -> output.
    for (uint64_t i = threadIdx.x; i < nv * n; i += blockDim.x) {
      const uint64_t r = i / nv;
      if ((int)r == rank) continue;
      const uint64_t v = r * sv + v0 + i % nv;
      if (v * 16 >= bytes) continue;
      storeWord<V>(recv, v, bytes, reinterpret_cast<const V*>(scratch)[v]);
    }
  }
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_rsag, mscclpp::coll::rsagAllreduce)
