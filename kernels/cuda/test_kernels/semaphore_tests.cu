// Semaphore test kernels (code object "semaphore_tests").
//
// extern "C" __global__ void semaphore_ping_pong(
//     MemoryDevice2DeviceSemaphoreDeviceHandle h,  // 24 bytes by value
//     int iters,                                   // round trips
//     int initiator,                               // 1: signal first, 0: wait first
//     int useStoreSignal,                          // 0: h.signal() (one red.release);
//                                                  // 1: old store-based signal (see below)
//     uint64_t* outboundCounter);                  // device memory, zeroed once before the first
//                                                  // launch on this handle; used only when
//                                                  // useStoreSignal = 1
// Launch: 1 block of 1 thread on each of the two ranks. Each loop iteration is one round trip:
// initiator: signal, wait; other: wait, signal. So a kernel makes 2 * iters one-way hops; the host
// divides the elapsed time by 2 * iters to report per-hop latency (upstream's "us/iter").
//
// Store-based signal (the design the seed replaced, kept for the comparison in docs/perf.md):
//   v = fetch_add(outboundCounter, 1) + 1 (relaxed, local); st.release.sys [remoteInboundToken], v.
// The two kinds must not be mixed on one handle within a run (the store overwrites the token).
//
// extern "C" __global__ void semaphore_signal(MemoryDevice2DeviceSemaphoreDeviceHandle h);
//   One thread, one h.signal() (kernels/check.sh checks its PTX/SASS holds exactly one red.release).
// extern "C" __global__ void semaphore_signal_n(MemoryDevice2DeviceSemaphoreDeviceHandle h, int n);
// extern "C" __global__ void semaphore_wait_n(MemoryDevice2DeviceSemaphoreDeviceHandle h, int n,
//                                             int usePoll, uint64_t* seen);
// Launch: 1 thread. signal_n signals n times; wait_n waits (or polls) n times, then writes the
// observed inbound token to *seen (for checking the counting on the host).
#include <mscclpp/semaphore_device.hpp>

#include "test_pattern.hpp"

using mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle;

__device__ __forceinline__ void storeSignal(MemoryDevice2DeviceSemaphoreDeviceHandle& h, uint64_t* outbound) {
  const uint64_t v = mscclpp::fetchAddRelaxedGpu(outbound, 1) + 1;
  mscclpp::storeReleaseSys(h.remoteInboundToken, v);
}

extern "C" __global__ void semaphore_ping_pong(MemoryDevice2DeviceSemaphoreDeviceHandle h, int iters, int initiator,
                                               int useStoreSignal, uint64_t* outboundCounter) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (useStoreSignal) {
    for (int i = 0; i < iters; ++i) {
      if (initiator) {
        storeSignal(h, outboundCounter);
        h.wait();
      } else {
        h.wait();
        storeSignal(h, outboundCounter);
      }
    }
  } else {
    for (int i = 0; i < iters; ++i) {
      if (initiator) {
        h.signal();
        h.wait();
      } else {
        h.wait();
        h.signal();
      }
    }
  }
}

extern "C" __global__ void semaphore_signal(MemoryDevice2DeviceSemaphoreDeviceHandle h) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  h.signal();
}

extern "C" __global__ void semaphore_signal_n(MemoryDevice2DeviceSemaphoreDeviceHandle h, int n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (int i = 0; i < n; ++i) h.signal();
}

extern "C" __global__ void semaphore_wait_n(MemoryDevice2DeviceSemaphoreDeviceHandle h, int n, int usePoll,
                                            uint64_t* seen) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (int i = 0; i < n; ++i) {
    waitOrPoll(h, usePoll, "semaphore_wait_n: poll never succeeded");
  }
  *seen = mscclpp::loadAcquireSys(h.inboundToken);
}
