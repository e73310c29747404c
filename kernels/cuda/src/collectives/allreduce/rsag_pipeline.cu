// All-reduce rsag_pipeline (core/src/collectives/allreduce/rsag_pipeline.rs has the protocol):
// blocks [0, P) PUT, blocks [P, P + R) REDUCE (R = K * P). Iteration i moves n slices of W bytes
// through scratch stage i % D (stage: RS area n x W, AG area n x W). PUT g writes its part of
// slice p of the input into slot `rank` of peer p's RS area, then tells its K REDUCE blocks; REDUCE
// r handshakes with block r of every peer, reduces its part of the own slice (own input + RS slots,
// rank order) into the output and slot `rank` of every peer's AG area, handshakes again, copies
// its part of every peer's AG slot into the output and tells its PUT block the stage is free. PUT
// blocks run up to D iterations ahead. PUT 0 first shakes hands with every peer (semaphore row
// 63) for all PUT blocks. Local words are stamped F << 32 | (i + 1) with F the launch's LL flag
// (unique per launch), so they never need resetting (graph replays included).
// Kernels: allreduce_rsag_pipeline_<dtype>_<op>(CollArgs), extra = {W, D, P, K}.
#include "../mesh.hpp"

namespace mscclpp {
namespace coll {

constexpr int kPipeMaxReduce = 64;
__device__ uint64_t pipeReady[kPipeMaxReduce];  // PUT -> REDUCE r: iteration done
__device__ uint64_t pipeDone[kPipeMaxReduce];   // REDUCE r -> PUT: stage of iteration free
__device__ uint64_t pipeGo;                     // PUT 0 -> PUT: peers are inside this launch

MSCCLPP_DEVICE_INLINE void pipeWaitAtLeast(const uint64_t* p, uint64_t v) {
  MSCCLPP_SPIN_UNTIL(loadAcquireSys(p) >= v, -1, "rsag_pipeline local step");
}

/// Bytes of slice `r` of iteration `i` that exist (the buffer ends at `total`).
MSCCLPP_DEVICE_INLINE uint64_t pipeSliceLen(uint64_t total, uint64_t at, uint64_t W) {
  return at >= total ? 0 : (total - at < W ? total - at : W);
}

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void rsagPipelineAllreduce(const CollArgs& a) {
  const uint64_t W = a.extra[0], D = a.extra[1], P = a.extra[2], K = a.extra[3];
  const uint64_t R = P * K;
  const uint64_t total = a.count * sizeof(T);
  const int rank = a.rank, n = a.nranks;
  const uint64_t iters = (total + (uint64_t)n * W - 1) / ((uint64_t)n * W);
  const uint32_t flag = blockFlag(a);
  const uint64_t stamp = (uint64_t)flag << 32;
  const uint64_t stageBytes = 2 * (uint64_t)n * W;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  const int t = threadIdx.x;
  if (blockIdx.x < P) {
    const uint64_t g = blockIdx.x;
    if (g == 0) {
      if (t < n && t != rank) {
        MemoryDevice2DeviceSemaphoreDeviceHandle& s = meshSem(a, 63, t);
        s.signal();
        s.wait();
      }
      __syncthreads();
      if (t == 0) storeReleaseSys(&pipeGo, stamp | 1);
    } else if (t == 0) {
      pipeWaitAtLeast(&pipeGo, stamp | 1);
    }
    __syncthreads();
    for (uint64_t i = 0; i < iters; ++i) {
      if (i >= D && t == 0) {
        for (uint64_t k = 0; k < K; ++k) pipeWaitAtLeast(&pipeDone[g * K + k], stamp | (i - D + 1));
      }
      __syncthreads();
      const uint64_t stage = (i % D) * stageBytes;
      for (int q = 1; q < n; ++q) {
        const int p = (rank + q) % n;
        const uint64_t at = i * n * W + (uint64_t)p * W;
        const uint64_t len = pipeSliceLen(total, at, W);
        uint64_t y0, y1, z0, z1;
        blockPart(len, R, g * K, y0, z0);
        blockPart(len, R, g * K + K - 1, z1, y1);
        blockCopy(plainOf(a, p) + stage + (uint64_t)rank * W + y0, send + at + y0, y1 - y0);
      }
      __syncthreads();
      if (t == 0) {
        __threadfence_system();
        for (uint64_t k = 0; k < K; ++k) storeReleaseSys(&pipeReady[g * K + k], stamp | (i + 1));
      }
    }
  } else if (blockIdx.x < P + R) {
    const uint64_t r = blockIdx.x - P;
    char* mine = plainOf(a, rank);
    __shared__ const char* srcs[kMaxRanks];
    __shared__ char* dsts[kMaxRanks];
    for (uint64_t i = 0; i < iters; ++i) {
      const uint64_t stage = (i % D) * stageBytes;
      const uint64_t at = i * n * W + (uint64_t)rank * W;
      uint64_t x0, x1;
      blockPart(pipeSliceLen(total, at, W), R, r, x0, x1);
      if (t == 0) pipeWaitAtLeast(&pipeReady[r], stamp | (i + 1));
      if (t < n) {
        srcs[t] = (t == rank) ? send + at + x0 : mine + stage + (uint64_t)t * W + x0;
        if (t != rank) dsts[(t - rank - 1 + n) % n] = plainOf(a, t) + stage + (uint64_t)(n + rank) * W + x0;
      }
      meshBarrier(a, r);
      blockReduce<T, OP>(recv + at + x0, dsts, n - 1, srcs, n, x1 - x0, n);
      meshBarrier(a, r);
      for (int q = 1; q < n; ++q) {
        const int p = (rank + q) % n;
        const uint64_t atp = i * n * W + (uint64_t)p * W;
        uint64_t p0, p1;
        blockPart(pipeSliceLen(total, atp, W), R, r, p0, p1);
        blockCopy(recv + atp + p0, mine + stage + (uint64_t)(n + p) * W + p0, p1 - p0);
      }
      __syncthreads();
      if (t == 0) storeReleaseSys(&pipeDone[r], stamp | (i + 1));
    }
  }
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_rsag_pipeline, mscclpp::coll::rsagPipelineAllreduce)
