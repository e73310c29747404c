// The kernel of example 08 (core/examples/08-own-kernel.rs): a kernel of one's own, written
// against the device API every channel handle has in kernels/cuda/include/mscclpp.
//
// extern "C" __global__ void own_put_signal_wait(MemoryChannelDeviceHandle ch, uint64_t bytes);
//   One block: every thread copies its share of `bytes` from ch.src to the peer's ch.dst; then
//   thread 0 signals the peer and waits for the peer's signal (its data has then arrived here).
#include <mscclpp/device_api.hpp>

extern "C" __global__ void own_put_signal_wait(mscclpp::MemoryChannelDeviceHandle ch, uint64_t bytes) {
  ch.put(0, 0, bytes, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    ch.signal();
    ch.wait();
  }
}
