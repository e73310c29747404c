// Where the FIFO round trip goes: a standalone breakdown (one GPU, one process).
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -I kernels/cuda/include kernels/cuda/tests/fifo_breakdown.cu -o fifo_breakdown
//   ./fifo_breakdown
//
// A host thread plays the proxy: it polls the trigger slot (acquire), checks the lap parity and
// pops (release-stores tail + 1), exactly as core/src/fifo.rs does. The device runs one thread:
//   mode 0  FifoDeviceHandle::push + sync (the shipped code: fence + 128-bit release store to
//           host memory, then acquire loads of the host tail until it moves)
//   mode 1  as 0, but the trigger store is relaxed (no MEMBAR.SYS): what the release costs
//   mode 2  as 0, but sync polls with relaxed loads and fences once at the end
//   mode 3  floor: the device stores i+1 to a host word (relaxed), the host echoes it into a
//           second host word, the device polls that (relaxed): one PCIe write + one PCIe read
//           round trip per iteration, no fences
//   mode 4  push throughput: push only, no sync (the host pops as fast as it can)
// Each mode reports us per iteration measured with %globaltimer inside the kernel.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include <mscclpp/atomic_device.hpp>
#include <mscclpp/fifo_device.hpp>

#include "breakdown_util.hpp"

__global__ void fifoModes(mscclpp::FifoDeviceHandle f, int mode, uint64_t n, uint64_t* a, uint64_t* b,
                          uint64_t* elapsedNs) {
  const uint64_t start = globalTimer();
  for (uint64_t i = 0; i < n; ++i) {
    mscclpp::ProxyTrigger t{i, (i * 0x9E3779B97F4A7C15ull) & ~mscclpp::TriggerCommitBit};
    if (mode == 0) {
      f.sync(f.push(t));
    } else if (mode == 1 || mode == 2) {
      const uint64_t pos = mscclpp::fetchAddRelaxedGpu(f.head, 1);
      mscclpp::ProxyTrigger* slot = &f.triggers[pos & (uint64_t)(f.size - 1)];
      const uint64_t snd = t.snd | mscclpp::triggerParityBit(pos, f.size);
      if (mode == 1) {
        mscclpp::store128RelaxedSys(reinterpret_cast<uint64_t*>(slot), t.fst, snd);
        while (mscclpp::loadAcquireSys(f.tail) <= pos) {
        }
      } else {
        mscclpp::store128ReleaseSys(reinterpret_cast<uint64_t*>(slot), t.fst, snd);
        while (mscclpp::loadRelaxedSys(f.tail) <= pos) {
        }
        __threadfence_system();
      }
    } else if (mode == 3) {
      mscclpp::storeRelaxedSys(a, i + 1);
      while (mscclpp::loadRelaxedSys(b) < i + 1) {
      }
    } else {
      f.push(t);
    }
  }
  *elapsedNs = globalTimer() - start;
}

int main() {
  const uint32_t size = 512;
  mscclpp::ProxyTrigger* trig;
  uint64_t* tail;
  uint64_t* words;  // a, b for mode 3
  CK(cudaSetDevice(0));
  CK(cudaHostAlloc(&trig, size * sizeof(mscclpp::ProxyTrigger), cudaHostAllocMapped));
  CK(cudaHostAlloc(&tail, 64, cudaHostAllocMapped));
  CK(cudaHostAlloc(&words, 256, cudaHostAllocMapped));
  mscclpp::FifoDeviceHandle f{};
  CK(cudaHostGetDevicePointer((void**)&f.triggers, trig, 0));
  CK(cudaHostGetDevicePointer((void**)&f.tail, tail, 0));
  uint64_t *dA, *dB;
  CK(cudaHostGetDevicePointer((void**)&dA, words, 0));
  CK(cudaHostGetDevicePointer((void**)&dB, words + 16, 0));  // another cache line
  CK(cudaMalloc(&f.head, 8));
  CK(cudaMalloc(&f.tailCache, 8));
  uint64_t* elapsed;
  CK(cudaMalloc(&elapsed, 8));
  f.size = size;
  const char* names[] = {"push + sync (shipped)", "relaxed trigger store + sync", "release store + relaxed-poll sync",
                         "PCIe floor: device write, host echo, device read", "push only (throughput)"};
  int failures = 0;
  for (int rep = 0; rep < 2; ++rep) {
    for (int mode = 0; mode < 5; ++mode) {
      const uint64_t n = 20000;
      std::memset(trig, 0, size * sizeof(mscclpp::ProxyTrigger));
      std::memset(words, 0, 256);
      *tail = 0;
      CK(cudaMemset(f.head, 0, 8));
      CK(cudaMemset(f.tailCache, 0, 8));
      CK(cudaDeviceSynchronize());
      std::atomic<bool> ok{true};
      std::thread host([&]() {
        if (mode == 3) {
          volatile uint64_t* a = words;
          volatile uint64_t* b = words + 16;
          for (uint64_t i = 1; i <= n; ++i) {
            while (__atomic_load_n(const_cast<uint64_t*>(a), __ATOMIC_ACQUIRE) < i) {
            }
            __atomic_store_n(const_cast<uint64_t*>(b), i, __ATOMIC_RELEASE);
          }
          return;
        }
        for (uint64_t t = 0; t < n; ++t) {
          mscclpp::ProxyTrigger* s = &trig[t & (size - 1)];
          const uint64_t want = ((t & size) == 0) ? mscclpp::TriggerCommitBit : 0;
          uint64_t snd;
          while (((snd = __atomic_load_n(&s->snd, __ATOMIC_ACQUIRE)) & mscclpp::TriggerCommitBit) != want) {
          }
          if (__atomic_load_n(&s->fst, __ATOMIC_RELAXED) != t ||
              (snd & ~mscclpp::TriggerCommitBit) != ((t * 0x9E3779B97F4A7C15ull) & ~mscclpp::TriggerCommitBit))
            ok = false;
          __atomic_store_n(tail, t + 1, __ATOMIC_RELEASE);
        }
      });
      fifoModes<<<1, 1>>>(f, mode, n, dA, dB, elapsed);
      CK(cudaDeviceSynchronize());
      host.join();
      uint64_t ns = 0;
      CK(cudaMemcpy(&ns, elapsed, 8, cudaMemcpyDeviceToHost));
      if (!ok) {
        ++failures;
        std::printf("mode %d: wrong trigger contents\n", mode);
      }
      if (rep == 1) std::printf("| %d | %s | %.3f |\n", mode, names[mode], ns / 1000.0 / n);
    }
  }
  std::printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
