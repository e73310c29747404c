// The world-size-1 copy (issue 28: an out-of-place all-reduce of one rank is a device copy) at
// the sizes where the system NCCL was faster on an H200 (2026-12-06, docs/perf.md round 22: 4.48
// against our 4.87 us per eager call at 4 MiB; 0.2-0.3 % at 16-256 MiB, where ours is the
// driver's copy). Times back-to-back eager calls of the library's own kernel (coll_copy,
// included from kernels/cuda/src/collectives/copy.cu) at the grid the library gives it
// (copy_grid in core/src/collectives/copy.rs: a block of 512 per 32 KiB, at most 4 per SM), at
// a block per 8 KiB (every vector's load in flight at once below the cap) and at fixed grids,
// other copy loops (2 or 8 loads in flight, streaming hints, block tiles), and the driver's
// copy (cudaMemcpyAsync); each row the fastest of three rounds. One process, no MPS. Written
// in round 22; run in round 25 on an H200 (docs/perf.md): no grid beats the library's at every
// size, and the kernel beats the driver's copy at 1-4 MiB.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels/cuda/include kernels/cuda/tests/copy_bw.cu -o copy_bw
//   ./copy_bw
//
// Rows: size, variant, blocks x threads, us per call (the time of 200 calls after 20, divided),
// GB/s of data copied; then a check of one full-size copy of the library's kernel.
#include "../src/collectives/copy.cu"
#include "breakdown_util.hpp"

/// One 16-byte vector through the cache (Stream false) or with streaming hints (true: loaded
/// through the non-coherent path, stored evict-first, as the data is not read again here).
template <bool Stream>
__device__ __forceinline__ uint4 loadVec(const uint4* p) {
  if constexpr (Stream) return __ldcs(p);
  return *p;
}
template <bool Stream>
__device__ __forceinline__ void storeVec(uint4* p, uint4 v) {
  if constexpr (Stream) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

/// coll_copy's grid-stride loop with U 16-byte loads in flight per thread (coll_copy: 4).
/// 16-byte aligned buffers, a multiple of 16 bytes.
template <int U, bool Stream>
__global__ void __launch_bounds__(1024) copyU(uint4* d, const uint4* s, uint64_t n) {
  const uint64_t nthreads = (uint64_t)gridDim.x * blockDim.x;
  uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * nthreads < n; i += U * nthreads) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = loadVec<Stream>(s + i + u * nthreads);
#pragma unroll
    for (int u = 0; u < U; ++u) storeVec<Stream>(d + i + u * nthreads, r[u]);
  }
  for (; i < n; i += nthreads) storeVec<Stream>(d + i, loadVec<Stream>(s + i));
}

/// Each block copies tiles of blockDim * U contiguous vectors (a block's loads stay within one
/// tile at a time), tiles striding by the grid.
template <int U>
__global__ void __launch_bounds__(1024) copyTiled(uint4* d, const uint4* s, uint64_t n) {
  const uint64_t tile = (uint64_t)blockDim.x * U;
  for (uint64_t base = blockIdx.x * tile; base < n; base += (uint64_t)gridDim.x * tile) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint64_t i = base + u * blockDim.x + threadIdx.x;
      if (i < n) r[u] = s[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint64_t i = base + u * blockDim.x + threadIdx.x;
      if (i < n) d[i] = r[u];
    }
  }
}

/// 512-thread blocks for a copy of `bytes`: one per `perBlock` bytes, at most 4 per SM. With
/// 32 KiB per block it is copy_grid of core/src/collectives/copy.rs.
static int blocksFor(uint64_t bytes, int sms, uint64_t perBlock) {
  const uint64_t want = (bytes + perBlock - 1) / perBlock;
  const uint64_t cap = 4ull * sms;
  return (int)(want < 1 ? 1 : want > cap ? cap : want);
}

static const int kCalls = 200, kWarm = 20, kRounds = 3;

/// Fastest of kRounds of (kCalls back-to-back calls of `launch` after kWarm) / kCalls, in us.
template <typename F>
static float perCall(cudaStream_t s, F launch) {
  float best = 1e30f;
  for (int r = 0; r < kRounds; ++r) {
    const float us = usPerLaunch(s, kWarm, kCalls, launch);
    if (us < best) best = us;
  }
  return best;
}

static void row(uint64_t bytes, const char* what, int blocks, int threads, float us) {
  std::printf("%10llu  %-22s %5d x %4d  %9.2f us  %8.1f GB/s\n", (unsigned long long)bytes, what, blocks, threads,
              us, bytes / us / 1e3);
}

int main() {
  const uint64_t maxBytes = 256ull << 20;
  void *src, *dst;
  CK(cudaMalloc(&src, maxBytes));
  CK(cudaMalloc(&dst, maxBytes));
  CK(cudaMemset(src, 0x5a, maxBytes));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  const int sms = p.multiProcessorCount;
  std::printf("%s, %d SMs; eager calls, fastest of %d rounds of %d\n", p.name, sms, kRounds, kCalls);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint4* d4 = (uint4*)dst;
  const uint4* s4 = (const uint4*)src;
  for (uint64_t bytes : {1ull << 10, 1ull << 20, 4ull << 20, 16ull << 20, 64ull << 20, 256ull << 20}) {
    const uint64_t n = bytes / 16;
    row(bytes, "cudaMemcpyAsync", 0, 0,
        perCall(s, [&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); }));
    const int lb = blocksFor(bytes, sms, 32 << 10);
    row(bytes, "coll_copy (library)", lb, 512, perCall(s, [&] { coll_copy<<<lb, 512, 0, s>>>(dst, src, bytes); }));
    // 16 bytes per thread: every vector's load in flight at once below the cap.
    const int nb = blocksFor(bytes, sms, 8 << 10);
    row(bytes, "coll_copy (8 KiB/block)", nb, 512, perCall(s, [&] { coll_copy<<<nb, 512, 0, s>>>(dst, src, bytes); }));
    for (int perSm : {1, 2, 4, 8}) {
      for (int t : {256, 512, 1024}) {
        if (perSm * t > 2048) continue;
        const int blocks = perSm * sms;
        if (bytes < 16ull * blocks * t) continue;  // fewer than 16 bytes per thread
        row(bytes, "coll_copy", blocks, t, perCall(s, [&] { coll_copy<<<blocks, t, 0, s>>>(dst, src, bytes); }));
      }
    }
    for (int perSm : {2, 4}) {
      const int blocks = perSm * sms, t = 512;
      if (bytes < 16ull * blocks * t) continue;
      row(bytes, "U=8", blocks, t, perCall(s, [&] { copyU<8, false><<<blocks, t, 0, s>>>(d4, s4, n); }));
      row(bytes, "U=2", blocks, t, perCall(s, [&] { copyU<2, false><<<blocks, t, 0, s>>>(d4, s4, n); }));
      row(bytes, "streaming U=4", blocks, t, perCall(s, [&] { copyU<4, true><<<blocks, t, 0, s>>>(d4, s4, n); }));
      row(bytes, "tiled U=4", blocks, t, perCall(s, [&] { copyTiled<4><<<blocks, t, 0, s>>>(d4, s4, n); }));
      row(bytes, "tiled U=8", blocks, t, perCall(s, [&] { copyTiled<8><<<blocks, t, 0, s>>>(d4, s4, n); }));
    }
  }
  // The library's kernel copies right: a cleared destination after one full-size copy.
  CK(cudaMemset(dst, 0, maxBytes));
  coll_copy<<<blocksFor(maxBytes, sms, 32 << 10), 512, 0, s>>>(dst, src, maxBytes);
  CK(cudaStreamSynchronize(s));
  unsigned char probe[2];
  CK(cudaMemcpy(&probe[0], (char*)dst + maxBytes - 1, 1, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&probe[1], (char*)dst + maxBytes / 2, 1, cudaMemcpyDeviceToHost));
  std::printf("check: %02x %02x (want 5a 5a): %s\n", probe[0], probe[1],
              probe[0] == 0x5a && probe[1] == 0x5a ? "ok" : "WRONG");
  return probe[0] == 0x5a && probe[1] == 0x5a ? 0 : 1;
}
