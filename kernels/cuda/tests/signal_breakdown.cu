// Where a signal hop goes: a standalone breakdown of the semaphore ping-pong (one process, two
// GPUs with peer access, one thread on each, %globaltimer; the first GPU's kernel is timed).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -I kernels/cuda/include kernels/cuda/tests/signal_breakdown.cu -o signal_breakdown
//   ./signal_breakdown
//
// Every variant signals with the shipped red.release.sys.global.add.u64; they differ in wait():
//   0  shipped: ++*expected (device memory), spin on ld.acquire.sys
//   1  expected kept in a register, spin on ld.acquire.sys
//   2  ++*expected, spin on ld.relaxed.sys, then one ld.acquire.sys of the token (the acquire
//      load reads a value >= the relaxed one by coherence, so it synchronizes with the signal)
//   3  ++*expected, spin on ld.relaxed.sys, then fence.acq_rel.sys
//   4  raw floor: register counter, relaxed red, relaxed poll (no ordering at all)
// Prints us per one-way hop.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include <mscclpp/atomic_device.hpp>
#include <mscclpp/semaphore_device.hpp>

#include "breakdown_util.hpp"

__device__ __forceinline__ void waitVariant(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle& h, int mode,
                                            uint64_t& reg) {
  if (mode == 0) {
    h.wait();
  } else if (mode == 1 || mode == 4) {
    ++reg;
    if (mode == 1) {
      while (mscclpp::loadAcquireSys(h.inboundToken) < reg) {
      }
    } else {
      while (mscclpp::loadRelaxedSys(h.inboundToken) < reg) {
      }
    }
  } else {
    const uint64_t expected = *h.expectedInboundToken + 1;
    *h.expectedInboundToken = expected;
    while (mscclpp::loadRelaxedSys(h.inboundToken) < expected) {
    }
    if (mode == 2) {
      (void)mscclpp::loadAcquireSys(h.inboundToken);
    } else {
      asm volatile("fence.acq_rel.sys;" ::: "memory");
    }
  }
}

__global__ void pingPong(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle h, int mode, int iters, int initiator,
                         uint64_t* elapsedNs) {
  uint64_t reg = 0;
  const uint64_t start = globalTimer();
  for (int i = 0; i < iters; ++i) {
    if (initiator) {
      if (mode == 4) mscclpp::redAddRelaxedSys(h.remoteInboundToken, 1); else h.signal();
      waitVariant(h, mode, reg);
    } else {
      waitVariant(h, mode, reg);
      if (mode == 4) mscclpp::redAddRelaxedSys(h.remoteInboundToken, 1); else h.signal();
    }
  }
  *elapsedNs = globalTimer() - start;
}

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("SKIPPED: needs two GPUs, found %d\n", n);
    return 0;
  }
  uint64_t* tok[2];
  uint64_t* exp[2];
  uint64_t* elapsed[2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&tok[d], 8));
    CK(cudaMalloc(&exp[d], 8));
    CK(cudaMalloc(&elapsed[d], 8));
  }
  const char* names[] = {"shipped: ++*expected, ld.acquire.sys poll", "expected in a register, ld.acquire.sys poll",
                         "relaxed poll, then one ld.acquire.sys", "relaxed poll, then fence.acq_rel.sys",
                         "floor: relaxed red, relaxed poll, register counter"};
  const int iters = 20000;
  std::printf("| variant | wait | us/hop (rep 1) | us/hop (rep 2) |\n|---|---|---|---|\n");
  for (int mode = 0; mode < 5; ++mode) {
    double us[2];
    for (int rep = 0; rep < 3; ++rep) {
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMemset(tok[d], 0, 8));
        CK(cudaMemset(exp[d], 0, 8));
        CK(cudaDeviceSynchronize());
      }
      for (int d = 0; d < 2; ++d) {
        mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle h{tok[d], tok[1 - d], exp[d]};
        CK(cudaSetDevice(d));
        pingPong<<<1, 1>>>(h, mode, iters, d == 0, elapsed[d]);
        CK(cudaGetLastError());
      }
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaDeviceSynchronize());
      }
      uint64_t ns = 0;
      CK(cudaSetDevice(0));
      CK(cudaMemcpy(&ns, elapsed[0], 8, cudaMemcpyDeviceToHost));
      if (rep > 0) us[rep - 1] = ns / 1000.0 / (2.0 * iters);
    }
    std::printf("| %d | %s | %.3f | %.3f |\n", mode, names[mode], us[0], us[1]);
  }
  return 0;
}
