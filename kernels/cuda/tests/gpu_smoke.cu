// Standalone two-GPU smoke/perf test of the device API in one process (peer access between GPU 0
// and GPU 1), independent of the Rust side. Not part of the library build.
// Build and run on a 2-GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90 -I kernels/cuda/include kernels/cuda/tests/gpu_smoke.cu -o smoke && ./smoke
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "../src/fifo_tests.cu"
#include "../src/memory_channel_tests.cu"
#include "../src/semaphore_tests.cu"

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

template <typename T>
T* allocOn(int dev, size_t n) {
  T* p;
  CK(cudaSetDevice(dev));
  CK(cudaMalloc(&p, n * sizeof(T)));
  CK(cudaMemset(p, 0, n * sizeof(T)));
  return p;
}

static double nowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void syncBoth() {
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
  }
}

int failures = 0;
static void expect(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "[ OK ]" : "[FAIL]", what);
  if (!ok) ++failures;
}

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("need 2 GPUs\n");
    return 1;
  }
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
  }
  // Semaphores.
  uint64_t* inbound[2];
  uint64_t* expected[2];
  uint64_t* outbound[2];
  for (int d = 0; d < 2; ++d) {
    inbound[d] = allocOn<uint64_t>(d, 1);
    expected[d] = allocOn<uint64_t>(d, 1);
    outbound[d] = allocOn<uint64_t>(d, 1);
  }
  auto resetSem = [&]() {
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMemset(inbound[d], 0, 8));
      CK(cudaMemset(expected[d], 0, 8));
      CK(cudaMemset(outbound[d], 0, 8));
    }
  };
  mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle sem[2];
  for (int d = 0; d < 2; ++d) sem[d] = {inbound[d], inbound[1 - d], expected[d]};

  for (int store = 0; store < 2; ++store) {
    const int iters = 20000;
    for (int rep = 0; rep < 2; ++rep) {
      resetSem();
      const double t0 = nowUs();
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        semaphore_ping_pong<<<1, 1>>>(sem[d], iters, d == 0, store, outbound[d]);
      }
      syncBoth();
      const double t1 = nowUs();
      if (rep == 1) std::printf("[PERF] semaphore ping-pong (%s): %.3f us/hop\n", store ? "store-based" : "red", (t1 - t0) / (2.0 * iters));
    }
    uint64_t v[2];
    for (int d = 0; d < 2; ++d) CK(cudaMemcpy(&v[d], inbound[d], 8, cudaMemcpyDeviceToHost));
    char msg[128];
    std::snprintf(msg, sizeof msg, "semaphore tokens after ping-pong (%s) = %llu, %llu (want %d)", store ? "store" : "red",
                  (unsigned long long)v[0], (unsigned long long)v[1], iters);
    expect(v[0] == (uint64_t)iters && v[1] == (uint64_t)iters, msg);
  }

  // Memory channel buffers.
  const size_t bufBytes = 1ull << 30;
  char* data[2];
  char* pkt[2];
  int* err[2];
  for (int d = 0; d < 2; ++d) {
    data[d] = allocOn<char>(d, bufBytes);
    pkt[d] = allocOn<char>(d, 1 << 24);
    err[d] = allocOn<int>(d, 1);
  }
  auto chan = [&](int d, bool packets) {
    mscclpp::MemoryChannelDeviceHandle c;
    c.semaphore = sem[d];
    c.dst = packets ? pkt[1 - d] : data[1 - d];
    c.src = data[d];
    c.packetBuffer = pkt[d];
    return c;
  };
  auto errors = [&]() {
    int e[2];
    for (int d = 0; d < 2; ++d) CK(cudaMemcpy(&e[d], err[d], 4, cudaMemcpyDeviceToHost));
    return e[0] + e[1];
  };
  struct Case { uint64_t offset, nElem; };
  for (Case c : {Case{0, 1}, Case{4, 3}, Case{12, 1021}, Case{0, 1 << 20}, Case{8, (1 << 20) + 5}}) {
    for (int get = 0; get < 2; ++get) {
      resetSem();
      for (int d = 0; d < 2; ++d) CK(cudaMemset(err[d], 0, 4));
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        if (get)
          memory_channel_get_ping_pong<<<1, 512>>>(chan(d, false), c.offset, c.nElem, 20, d == 0, 1234 + c.nElem, 1, err[d]);
        else
          memory_channel_put_ping_pong<<<1, 512>>>(chan(d, false), c.offset, c.nElem, 20, d == 0, 1234 + c.nElem, 1, err[d]);
      }
      syncBoth();
      char msg[128];
      std::snprintf(msg, sizeof msg, "%s ping-pong offset %llu nElem %llu: errors %d", get ? "get" : "put",
                    (unsigned long long)c.offset, (unsigned long long)c.nElem, errors());
      expect(errors() == 0, msg);
    }
  }
  // Negative control: a receiver checking a pattern from a different seed must report errors.
  {
    resetSem();
    for (int d = 0; d < 2; ++d) CK(cudaMemset(err[d], 0, 4));
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      memory_channel_put_ping_pong<<<1, 256>>>(chan(d, false), 0, 1000, 2, d == 0, d == 0 ? 1 : 2, 1, err[d]);
    }
    syncBoth();
    expect(errors() > 0, "negative control: mismatched seeds are detected");
  }

  // Packets.
  uint32_t flagBase = 0;
  for (int ll8 = 1; ll8 >= 0; --ll8) {
    for (uint64_t nElem : {2ull, 64ull, 4096ull}) {
      resetSem();
      for (int d = 0; d < 2; ++d) CK(cudaMemset(err[d], 0, 4));
      const int iters = 1000;
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        if (ll8)
          memory_channel_ll8_ping_pong<<<1, 512>>>(chan(d, true), nElem, iters, d == 0, flagBase, 99, 1, err[d]);
        else
          memory_channel_ll16_ping_pong<<<1, 512>>>(chan(d, true), nElem, iters, d == 0, flagBase, 99, 1, err[d]);
      }
      syncBoth();
      flagBase += iters;
      char msg[128];
      std::snprintf(msg, sizeof msg, "%s ping-pong nElem %llu: errors %d", ll8 ? "LL8" : "LL16", (unsigned long long)nElem, errors());
      expect(errors() == 0, msg);
    }
    // latency: 1 thread-worth of data, no check
    const int iters = 20000;
    const uint64_t nElem = ll8 ? 1 : 2;
    for (int rep = 0; rep < 2; ++rep) {
      const double t0 = nowUs();
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        if (ll8)
          memory_channel_ll8_ping_pong<<<1, 32>>>(chan(d, true), nElem, iters, d == 0, flagBase, 0, 0, err[d]);
        else
          memory_channel_ll16_ping_pong<<<1, 32>>>(chan(d, true), nElem, iters, d == 0, flagBase, 0, 0, err[d]);
      }
      syncBoth();
      flagBase += iters;
      const double t1 = nowUs();
      if (rep == 1) std::printf("[PERF] %s ping-pong: %.3f us/hop\n", ll8 ? "LL8" : "LL16", (t1 - t0) / iters);
    }
  }

  // Bandwidth: GPU0 -> GPU1, 1 GiB.
  for (int blocks : {66, 132}) {
    for (int threads : {512, 1024}) {
      const int iters = 5;
      for (int rep = 0; rep < 2; ++rep) {
        resetSem();
        cudaEvent_t a, b;
        CK(cudaSetDevice(0));
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        CK(cudaSetDevice(1));
        memory_channel_put_bandwidth<<<1, 1>>>(chan(1, false), bufBytes, iters, 0, blocks);
        CK(cudaSetDevice(0));
        CK(cudaEventRecord(a));
        memory_channel_put_bandwidth<<<blocks, threads>>>(chan(0, false), bufBytes, iters, 1, 1);
        CK(cudaEventRecord(b));
        syncBoth();
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (rep == 1) std::printf("[PERF] memory channel put %d x %d: %.1f GB/s\n", blocks, threads, bufBytes * (double)iters / (ms * 1e6));
      }
    }
  }

  // FIFO: host-mapped triggers and tail, a host thread pops.
  {
    const uint32_t size = 64;
    mscclpp::ProxyTrigger* trig;
    uint64_t* tail;
    CK(cudaSetDevice(0));
    CK(cudaHostAlloc(&trig, size * sizeof(mscclpp::ProxyTrigger), cudaHostAllocMapped));
    CK(cudaHostAlloc(&tail, 64, cudaHostAllocMapped));
    std::memset(trig, 0, size * 16);
    *tail = 0;
    mscclpp::FifoDeviceHandle f;
    CK(cudaHostGetDevicePointer((void**)&f.triggers, trig, 0));
    CK(cudaHostGetDevicePointer((void**)&f.tail, tail, 0));
    f.head = allocOn<uint64_t>(0, 1);
    f.tailCache = allocOn<uint64_t>(0, 1);
    f.size = size;
    f.pad = 0;
    for (int mode = 0; mode < 3; ++mode) {
      const uint64_t perThread = mode == 2 ? 2000 : 10000;
      const int threads = mode == 2 ? 64 : 1;
      const uint64_t total = perThread * threads;
      std::vector<int> seen(total, 0);
      std::vector<uint64_t> lastK(threads, 0);
      bool ok = true, lastOk = true;
      std::thread host([&]() {
        uint64_t t = *tail;
        for (uint64_t i = 0; i < total; ++i, ++t) {
          volatile mscclpp::ProxyTrigger* s = &trig[t & (size - 1)];
          const uint64_t want = ((t & size) == 0) ? mscclpp::TriggerCommitBit : 0;
          uint64_t snd;
          const double start = nowUs();
          uint64_t spins = 0;
          while (((snd = __atomic_load_n(&s->snd, __ATOMIC_ACQUIRE)) & mscclpp::TriggerCommitBit) != want) {
            if ((++spins & 0xfffff) == 0 && nowUs() - start > 1e7) { ok = false; return; }
          }
          const uint64_t k = s->fst;
          if (k >= total || seen[k]++ || (snd & ~mscclpp::TriggerCommitBit) != ((k * 0x9E3779B97F4A7C15ull) & ~mscclpp::TriggerCommitBit)) ok = false;
          const uint64_t th = k / perThread;
          if (k % perThread != 0 && lastK[th] + 1 != k) lastOk = false;
          lastK[th] = k;
          __atomic_store_n(tail, t + 1, __ATOMIC_RELEASE);
        }
      });
      uint64_t* elapsed = allocOn<uint64_t>(0, 1);
      CK(cudaSetDevice(0));
      if (mode == 2) fifo_push<<<2, 32>>>(f, perThread, 7, nullptr);
      else fifo_push_perf<<<1, 1>>>(f, perThread, mode == 0 ? 1 : 0, elapsed);
      CK(cudaDeviceSynchronize());
      host.join();
      uint64_t ns = 0;
      CK(cudaMemcpy(&ns, elapsed, 8, cudaMemcpyDeviceToHost));
      char msg[160];
      std::snprintf(msg, sizeof msg, "FIFO mode %d: every trigger seen once with the right contents, per-thread order kept", mode);
      expect(ok && lastOk, msg);
      if (mode < 2) std::printf("[PERF] FIFO %s: %.3f us/trigger\n", mode == 0 ? "push+sync round trip" : "push throughput", ns / 1000.0 / perThread);
    }
  }
  std::printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
