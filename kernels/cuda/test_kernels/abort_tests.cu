// Abort-word test kernels (code object "abort_tests"), for DeviceAbortTest.
//
// extern "C" __global__ void abort_wait_forever(const uint64_t* flag, uint64_t* out);
//   One thread waits with MSCCLPP_SPIN_UNTIL for *flag to become non-zero (the test never sets
//   it), then writes out[0] = 1 + (whether the flag was set) and out[1] = 1 when the abort word
//   was seen raised: the wait ends only through the abort word the host raises
//   (mscclpp_hal::abort), within a few thousand spins and without a trap.
// Launch: 1 block of 1 thread.
#include <mscclpp/atomic_device.hpp>
#include <mscclpp/device.hpp>

extern "C" __global__ void abort_wait_forever(const uint64_t* flag, uint64_t* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  MSCCLPP_SPIN_UNTIL(mscclpp::loadAcquireSys(flag) != 0, -1, "a flag nobody sets");
  out[0] = 1 + (mscclpp::loadAcquireSys(flag) != 0 ? 1 : 0);
  out[1] = mscclpp::abortRaised() ? 1 : 0;
}
