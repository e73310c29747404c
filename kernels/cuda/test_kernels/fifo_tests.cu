// FIFO test kernels (code object "fifo_tests").
//
// Test trigger k (what the host expects to pop; commit bit set by push):
//   fst = k
//   snd = (k * 0x9E3779B97F4A7C15) & 0x7FFFFFFFFFFFFFFF        (u64 wrap)
//
// extern "C" __global__ void fifo_push(FifoDeviceHandle fifo, uint64_t n, int syncEvery,
//                                      uint64_t* lastPos);
//   Every thread of the grid (global id g) pushes test triggers k = g * n + j for j = 0..n-1 in
//   order. syncEvery > 0: after every syncEvery-th push, and after the last, the thread waits for
//   the host to pop that trigger (fifo.sync(pos)). lastPos (may be null): lastPos[g] = the
//   position of g's last push. The host sees each k exactly once, each thread's in increasing order.
//
// extern "C" __global__ void fifo_push_perf(FifoDeviceHandle fifo, uint64_t n, int syncEvery,
//                                           uint64_t* elapsed);
//   One thread pushes test triggers k = 0..n-1 as above (syncEvery = 1: push/pop round trips;
//   0: throughput, with one sync after the last push) and writes the time it took to *elapsed:
//   nanoseconds on CUDA (%globaltimer); on HIP wall_clock64() ticks (rate:
//   hipDeviceAttributeWallClockRate, kHz).
//
// extern "C" __global__ void fifo_failed_triggers(FifoDeviceHandle fifo, uint64_t n, int unused,
//                                                 uint64_t* out);
//   One thread: out[0] = fifo.failedTriggers(), pushes test trigger 0 and waits for its pop,
//   out[1] = fifo.failedTriggers(). A host that failed the trigger (and counted it before the
//   pop) makes out[1] - out[0] == 1.
#include <mscclpp/fifo_device.hpp>

using mscclpp::FifoDeviceHandle;
using mscclpp::ProxyTrigger;

__device__ __forceinline__ ProxyTrigger testTrigger(uint64_t k) {
  ProxyTrigger t;
  t.fst = k;
  t.snd = (k * 0x9E3779B97F4A7C15ull) & ~mscclpp::TriggerCommitBit;
  return t;
}

__device__ __forceinline__ uint64_t deviceTimer() {
#if defined(MSCCLPP_DEVICE_CUDA)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return wall_clock64();
#endif
}

__device__ __forceinline__ void pushRange(FifoDeviceHandle& fifo, uint64_t first, uint64_t n, int syncEvery,
                                          uint64_t* lastPos) {
  uint64_t pos = 0;
  for (uint64_t j = 0; j < n; ++j) {
    pos = fifo.push(testTrigger(first + j));
    if (syncEvery > 0 && ((j + 1) % (uint64_t)syncEvery == 0 || j + 1 == n)) fifo.sync(pos);
  }
  if (lastPos != nullptr) *lastPos = pos;
}

extern "C" __global__ void __launch_bounds__(1024) fifo_push(FifoDeviceHandle fifo, uint64_t n, int syncEvery, uint64_t* lastPos) {
  const uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  pushRange(fifo, g * n, n, syncEvery, lastPos != nullptr ? lastPos + g : nullptr);
}

extern "C" __global__ void fifo_push_perf(FifoDeviceHandle fifo, uint64_t n, int syncEvery, uint64_t* elapsed) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const uint64_t t0 = deviceTimer();
  uint64_t last = 0;
  pushRange(fifo, 0, n, syncEvery > 0 ? syncEvery : 0, &last);
  if (syncEvery <= 0 && n > 0) fifo.sync(last);
  *elapsed = deviceTimer() - t0;
}

extern "C" __global__ void fifo_failed_triggers(FifoDeviceHandle fifo, uint64_t n, int unused, uint64_t* out) {
  (void)n;
  (void)unused;
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  out[0] = fifo.failedTriggers();
  fifo.sync(fifo.push(testTrigger(0)));
  out[1] = fifo.failedTriggers();
}
