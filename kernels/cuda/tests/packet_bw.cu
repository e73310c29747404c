// How fast LL16 packets can move on one GPU, the bound under the executor's packet ops (issue 31:
// upstream's `transfer_pack` plan at 16 MiB took 69 us against the native all-gather's 28.5 on
// an H100, two ranks sharing it). One process, no MPS, no library code: the kernels below write
// and read packets the way kernels/cuda/include/mscclpp/packet_device.hpp does (16-byte packets:
// two 4-byte data words, each with its 4-byte flag), with the store and load instructions and
// the loads in flight per thread as variants, and print the time per pass and the data rate.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 kernels/cuda/tests/packet_bw.cu -o packet_bw
//   ./packet_bw [MiB of data, default 8]
//
// Rows:
//   copy        plain 16-byte copy of the data (the memory's own rate, for scale)
//   pack        data -> packets (reads N, writes 2N)
//   unpack      packets -> data, flags already there (reads 2N, writes N)
//   transfer    two "ranks" at once, each half its blocks packing its data into the other's
//               scratch and half unpacking its own scratch as it fills (transfer_pack's two
//               thread blocks: every block of both ranks resident, readers spinning)
//   small       the transfer of 1 KiB and 64 KiB, one pack and one unpack block per rank
//   sequential  the transfer's work in two phases: both ranks pack, then both unpack
// Variants: store = relaxed.sys v2.u64 (ours) | volatile v4.u32 | weak v2.u64 (no ordering: a
// bound, not usable for LL); load = relaxed.sys v2.u64 (ours) | volatile v4.u32; U = payloads
// per thread in flight; readers pausing between polls (__nanosleep); blocks x threads.
//
// H100s, 2026-12-06 (docs/perf.md, round 21: the ranges over three runs; 8 MiB): copy 4.85-5.36
// us; pack 6.6-13.1 and unpack 5.5-10.5 alone; the transfer 53-63 us at the executor's shape
// for upstream's transfer_pack (33 + 33 blocks of 1024 per rank), 45.8-48.0 at 132 + 132 of
// 512, 41.4-48.1 in two phases. Instructions within 2 %, pauses no faster.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "breakdown_util.hpp"

enum Store { kRelaxedSys = 0, kVolatile = 1, kWeak = 2 };
enum Load { kLoadRelaxedSys = 0, kLoadVolatile = 1 };

template <int S>
__device__ __forceinline__ void storePacket(uint64_t* p, uint32_t d0, uint32_t d1, uint32_t flag) {
  const uint64_t lo = ((uint64_t)flag << 32) | d0, hi = ((uint64_t)flag << 32) | d1;
  if constexpr (S == kRelaxedSys) {
    asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
  } else if constexpr (S == kVolatile) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag), "r"(d1),
                 "r"(flag)
                 : "memory");
  } else {
    asm volatile("st.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
  }
}

template <int L>
__device__ __forceinline__ bool loadPacket(const uint64_t* p, uint32_t flag, uint2& out) {
  uint32_t d0, f0, d1, f1;
  if constexpr (L == kLoadRelaxedSys) {
    uint64_t lo, hi;
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(p) : "memory");
    d0 = (uint32_t)lo, f0 = (uint32_t)(lo >> 32), d1 = (uint32_t)hi, f1 = (uint32_t)(hi >> 32);
  } else {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(p)
                 : "memory");
  }
  out = make_uint2(d0, d1);
  return f0 == flag && f1 == flag;
}

/// Packs payloads [i0, n) with stride `step` (U per thread in flight).
template <int S, int U>
__device__ __forceinline__ void packRange(uint64_t* pk, const uint2* data, uint64_t n, uint64_t i0, uint64_t step,
                                          uint32_t flag) {
  for (uint64_t i = i0; i < n; i += U * step) {
    uint2 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i + u * step < n) v[u] = data[i + u * step];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i + u * step < n) storePacket<S>(pk + 2 * (i + u * step), v[u].x, v[u].y, flag);
  }
}

/// How a reader waits for a packet not there yet: B = 0 polls again at once; B > 0 sleeps B ns
/// (__nanosleep) between polls; B < 0 sleeps 32 ns doubling up to -B ns.
template <int B>
__device__ __forceinline__ void pollPause(uint32_t& ns) {
  if constexpr (B > 0) {
    __nanosleep(B);
  } else if constexpr (B < 0) {
    __nanosleep(ns);
    ns = ns * 2 < (uint32_t)-B ? ns * 2 : (uint32_t)-B;
  }
}

template <int L, int U, int B = 0>
__device__ __forceinline__ void unpackRange(uint2* data, const uint64_t* pk, uint64_t n, uint64_t i0, uint64_t step,
                                            uint32_t flag) {
  for (uint64_t i = i0; i < n; i += U * step) {
    uint2 v[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) ok[u] = i + u * step >= n || loadPacket<L>(pk + 2 * (i + u * step), flag, v[u]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint32_t ns = 32;
      while (!ok[u]) {
        pollPause<B>(ns);
        ok[u] = loadPacket<L>(pk + 2 * (i + u * step), flag, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i + u * step < n) data[i + u * step] = v[u];
  }
}

__global__ void copyKernel(uint4* dst, const uint4* src, uint64_t n) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

template <int S, int U>
__global__ void packKernel(uint64_t* pk, const uint2* data, uint64_t n, uint32_t flag) {
  packRange<S, U>(pk, data, n, blockIdx.x * (uint64_t)blockDim.x + threadIdx.x, (uint64_t)gridDim.x * blockDim.x,
                  flag);
}

template <int L, int U>
__global__ void unpackKernel(uint2* data, const uint64_t* pk, uint64_t n, uint32_t flag) {
  unpackRange<L, U>(data, pk, n, blockIdx.x * (uint64_t)blockDim.x + threadIdx.x, (uint64_t)gridDim.x * blockDim.x,
                    flag);
}

/// One rank of the transfer: the first half of the blocks pack `data` into the peer's scratch,
/// the second half unpack this rank's scratch into `out`.
template <int S, int L, int U, int B = 0>
__global__ void transferKernel(uint64_t* peerScratch, const uint2* data, uint2* out, const uint64_t* scratch,
                               uint64_t n, uint32_t flag) {
  const uint32_t half = gridDim.x / 2;
  const uint64_t step = (uint64_t)half * blockDim.x;
  if (blockIdx.x < half) {
    packRange<S, U>(peerScratch, data, n, blockIdx.x * (uint64_t)blockDim.x + threadIdx.x, step, flag);
  } else {
    unpackRange<L, U, B>(out, scratch, n, (blockIdx.x - half) * (uint64_t)blockDim.x + threadIdx.x, step, flag);
  }
}

struct Bufs {
  uint2* data[2];
  uint2* out[2];
  uint64_t* scratch[2];
  uint64_t n;  // payloads (8 bytes each)
};

static uint32_t gFlag = 1;
static const int kIters = 20;

/// Microseconds per pass of `launch`: 3 warm-up passes, then kIters timed.
template <typename F>
static float timeIt(cudaStream_t s, F launch) {
  return usPerLaunch(s, 3, kIters, launch);
}

static void row(const char* what, const char* variant, int blocks, int threads, double dataBytes, float us) {
  std::printf("%-9s %-26s %4d x %4d  %9.2f us  %8.1f GB/s of data\n", what, variant, blocks, threads, us,
              dataBytes / us / 1e3);
}

/// Runs `a` on s0 and `b` on s1 after everything before on s0, and lets s0 go on only once both
/// ran: the two "ranks" of one pass.
struct TwoStreams {
  cudaStream_t s0, s1;
  cudaEvent_t fork, join;
  TwoStreams(cudaStream_t a, cudaStream_t b) : s0(a), s1(b) {
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  }
  ~TwoStreams() {
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
  }
  template <typename A, typename B>
  void run(A a, B b) {
    CK(cudaEventRecord(fork, s0));
    CK(cudaStreamWaitEvent(s1, fork, 0));
    a(s0);
    b(s1);
    CK(cudaEventRecord(join, s1));
    CK(cudaStreamWaitEvent(s0, join, 0));
  }
};

static const char* kStoreName[] = {"st.relaxed.sys", "st.volatile", "st.weak"};
static const char* kLoadName[] = {"ld.relaxed.sys", "ld.volatile"};

template <int S, int U>
static void pack(Bufs& b, cudaStream_t s, int blocks, int threads) {
  const float us =
      timeIt(s, [&] { packKernel<S, U><<<blocks, threads, 0, s>>>(b.scratch[0], b.data[0], b.n, ++gFlag); });
  char v[64];
  std::snprintf(v, sizeof v, "%s U=%d", kStoreName[S], U);
  row("pack", v, blocks, threads, b.n * 8.0, us);
}

template <int L, int U>
static void unpack(Bufs& b, cudaStream_t s, int blocks, int threads) {
  // Flags in place first: every pass reads packets written by one pack of the same flag.
  const uint32_t f = ++gFlag;
  packKernel<kRelaxedSys, 2><<<blocks, threads, 0, s>>>(b.scratch[0], b.data[0], b.n, f);
  const float us = timeIt(s, [&] { unpackKernel<L, U><<<blocks, threads, 0, s>>>(b.out[0], b.scratch[0], b.n, f); });
  char v[64];
  std::snprintf(v, sizeof v, "%s U=%d", kLoadName[L], U);
  row("unpack", v, blocks, threads, b.n * 8.0, us);
}

template <int S, int L, int U, int B = 0>
static void transfer(Bufs& b, cudaStream_t s0, cudaStream_t s1, int blocksPerRank, int threads,
                     uint64_t n = 0) {
  if (n == 0) n = b.n;
  // Readers spin on writers: every block of both ranks must be resident, else skip the row.
  int perSm = 0, sms = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, transferKernel<S, L, U, B>, threads, 0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (2 * blocksPerRank > perSm * sms) {
    std::printf("transfer  %d x %d per rank skipped: %d blocks of it fit per SM\n", blocksPerRank, threads, perSm);
    return;
  }
  TwoStreams two(s0, s1);
  const float us = timeIt(s0, [&] {
    const uint32_t f = ++gFlag;
    // Rank r packs its data into the other's scratch and unpacks its own scratch.
    auto rank = [&](int r) {
      return [&, r](cudaStream_t s) {
        transferKernel<S, L, U, B>
            <<<blocksPerRank, threads, 0, s>>>(b.scratch[1 - r], b.data[r], b.out[r], b.scratch[r], n, f);
      };
    };
    two.run(rank(0), rank(1));
  });
  char v[64];
  if (B == 0) {
    std::snprintf(v, sizeof v, "%s %s U=%d", kStoreName[S], kLoadName[L], U);
  } else {
    std::snprintf(v, sizeof v, "U=%d sleep %s%d ns", U, B < 0 ? "32..." : "", B < 0 ? -B : B);
  }
  // Per rank: its data out to the peer and the peer's into its output.
  row(n == b.n ? "transfer" : "small", v, blocksPerRank, threads, n * 8.0, us);
}

/// The transfer's work one phase after the other: both ranks pack (each into the other's
/// scratch) on two streams, then both unpack: what the overlap costs.
static void sequential(Bufs& b, cudaStream_t s0, cudaStream_t s1, int blocks, int threads) {
  TwoStreams two(s0, s1);
  const float us = timeIt(s0, [&] {
    const uint32_t f = ++gFlag;
    auto pack = [&](int r) {
      return [&, r](cudaStream_t s) {
        packKernel<kRelaxedSys, 2><<<blocks, threads, 0, s>>>(b.scratch[1 - r], b.data[r], b.n, f);
      };
    };
    auto unpack = [&](int r) {
      return [&, r](cudaStream_t s) {
        unpackKernel<kLoadRelaxedSys, 2><<<blocks, threads, 0, s>>>(b.out[r], b.scratch[r], b.n, f);
      };
    };
    two.run(pack(0), pack(1));
    two.run(unpack(0), unpack(1));
  });
  row("sequential", "pack both, then unpack both", blocks, threads, b.n * 8.0, us);
}

int main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 8;
  const uint64_t bytes = mib << 20;
  Bufs b;
  b.n = bytes / 8;
  for (int r = 0; r < 2; ++r) {
    CK(cudaMalloc(&b.data[r], bytes));
    CK(cudaMalloc(&b.out[r], bytes));
    CK(cudaMalloc(&b.scratch[r], 2 * bytes));
    CK(cudaMemset(b.data[r], 0x11 * (r + 1), bytes));
    CK(cudaMemset(b.scratch[r], 0, 2 * bytes));
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("%s, %d SMs; %llu MiB of data per rank, %d passes per row\n", p.name, p.multiProcessorCount,
              (unsigned long long)mib, kIters);
  cudaStream_t s0, s1;
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  const int sms = p.multiProcessorCount;

  for (int blocks : {sms, 2 * sms}) {
    const float us =
        timeIt(s0, [&] { copyKernel<<<blocks, 1024, 0, s0>>>((uint4*)b.out[0], (const uint4*)b.data[0], bytes / 16); });
    row("copy", "uint4", blocks, 1024, (double)bytes, us);
  }
  for (int blocks : {sms / 4, sms / 2, sms}) {
    pack<kRelaxedSys, 1>(b, s0, blocks, 1024);
    pack<kRelaxedSys, 2>(b, s0, blocks, 1024);
    pack<kRelaxedSys, 4>(b, s0, blocks, 1024);
    pack<kVolatile, 2>(b, s0, blocks, 1024);
    pack<kWeak, 2>(b, s0, blocks, 1024);
  }
  for (int blocks : {sms / 4, sms / 2, sms}) {
    unpack<kLoadRelaxedSys, 1>(b, s0, blocks, 1024);
    unpack<kLoadRelaxedSys, 2>(b, s0, blocks, 1024);
    unpack<kLoadRelaxedSys, 4>(b, s0, blocks, 1024);
    unpack<kLoadVolatile, 2>(b, s0, blocks, 1024);
  }
  // Both ranks' blocks resident at once (readers spin): at most one 1024-thread block per SM.
  for (int perRank : {sms / 4, sms / 2}) {
    transfer<kRelaxedSys, kLoadRelaxedSys, 1>(b, s0, s1, perRank, 1024);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2>(b, s0, s1, perRank, 1024);
    transfer<kRelaxedSys, kLoadRelaxedSys, 4>(b, s0, s1, perRank, 1024);
    transfer<kVolatile, kLoadVolatile, 2>(b, s0, s1, perRank, 1024);
    transfer<kWeak, kLoadRelaxedSys, 2>(b, s0, s1, perRank, 1024);
  }
  for (int perRank : {sms / 2, 2 * sms}) {
    transfer<kRelaxedSys, kLoadRelaxedSys, 2>(b, s0, s1, perRank, 512);
    transfer<kRelaxedSys, kLoadRelaxedSys, 4>(b, s0, s1, perRank, 512);
  }
  // Readers pausing between polls of a packet not there yet (__nanosleep), at the executor's
  // shape (33 + 33 blocks of 1024 per rank) and at 4 blocks of 512 per SM (2 per rank).
  for (int perRank : {sms / 2, 2 * sms}) {
    const int t = perRank == sms / 2 ? 1024 : 512;
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, 0>(b, s0, s1, perRank, t);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, 50>(b, s0, s1, perRank, t);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, 200>(b, s0, s1, perRank, t);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, 1000>(b, s0, s1, perRank, t);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, -256>(b, s0, s1, perRank, t);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, -2048>(b, s0, s1, perRank, t);
    transfer<kRelaxedSys, kLoadRelaxedSys, 4, -256>(b, s0, s1, perRank, t);
  }
  // Small messages (latency): 1 KiB and 64 KiB per rank, one pack and one unpack block each.
  for (uint64_t bytes : {1024ull, 65536ull}) {
    const int t = bytes == 1024 ? 128 : 1024;
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, 0>(b, s0, s1, 2, t, bytes / 8);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, 50>(b, s0, s1, 2, t, bytes / 8);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, 200>(b, s0, s1, 2, t, bytes / 8);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, -256>(b, s0, s1, 2, t, bytes / 8);
    transfer<kRelaxedSys, kLoadRelaxedSys, 2, -2048>(b, s0, s1, 2, t, bytes / 8);
  }
  // The same work without the overlap: per rank 33 and 66 blocks of 1024 per phase.
  for (int blocks : {sms / 4, sms / 2}) sequential(b, s0, s1, blocks, 1024);
  // The last full-size transfer again, so the check below sees full outputs.
  transfer<kRelaxedSys, kLoadRelaxedSys, 2, -256>(b, s0, s1, sms / 2, 1024);
  // Correctness of the last transfer: each rank's output is the other's data.
  uint32_t got[2];
  CK(cudaMemcpy(&got[0], b.out[0], 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&got[1], b.out[1], 4, cudaMemcpyDeviceToHost));
  const bool ok = got[0] == 0x22222222u && got[1] == 0x11111111u;
  std::printf("transfer check: rank 0 got %08x (want 22222222), rank 1 got %08x (want 11111111): %s\n", got[0],
              got[1], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
