// SwitchChannel test kernels (code object "switch_channel_tests"), used by SwitchChannelTest when
// NVLS is usable on a GPU build (never on the lent machines: there the tests skip first).
//
// extern "C" __global__ void switch_all_reduce(SwitchChannelDeviceHandle ch, uint64_t first,
//     uint64_t count, int kind);
//   Vectors [first, first + count) of the channel's buffer become their sum over every device
//   (multimem.ld_reduce then multimem.st), strided over the whole grid. kind: 0 = f32x4,
//   1 = f16x8, 2 = bf16x8. Each device passes its own slice, so every vector is done once.
// Compiled for every architecture of the build; below sm_90 (and under HIP) it does nothing but
// fail a device check, as the multimem instructions do not exist there.
#include <mscclpp/device_api.hpp>

using namespace mscclpp;

extern "C" __global__ void switch_all_reduce(SwitchChannelDeviceHandle ch, uint64_t first, uint64_t count,
                                             int kind) {
#if defined(MSCCLPP_DEVICE_CUDA)
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t nthreads = gridDim.x * blockDim.x;
  if (kind == 0) {
    ch.allReduce<f32x4>(first, count, tid, nthreads);
  } else if (kind == 1) {
    ch.allReduce<f16x8>(first, count, tid, nthreads);
  } else {
    ch.allReduce<bf16x8>(first, count, tid, nthreads);
  }
#else
  (void)ch;
  (void)first;
  (void)count;
  (void)kind;
  MSCCLPP_DEVICE_CHECK(false, "switch channels need NVLink multicast (CUDA sm_90+)");
#endif
}
