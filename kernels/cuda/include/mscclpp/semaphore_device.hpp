// Device halves of the semaphores: monotonic u64 tokens that are never reset.
//
// Layouts (all pointers 8 bytes; mirrored by #[repr(C)] structs on the Rust side):
//   Host2DeviceSemaphoreDeviceHandle          size 16: inboundToken @0, expectedInboundToken @8
//   MemoryDevice2DeviceSemaphoreDeviceHandle  size 24: inboundToken @0, remoteInboundToken @8,
//                                                      expectedInboundToken @16
// inboundToken: the counter peers (or the proxy) increment, in this GPU's memory.
// remoteInboundToken: the peer's inboundToken, mapped into this process (NVLink/PCIe peer memory).
// expectedInboundToken: device memory owned by this side; wait()/poll() advance it. Only one thread
// at a time may call wait()/poll() on one handle (they update *expectedInboundToken non-atomically).
#ifndef MSCCLPP_SEMAPHORE_DEVICE_HPP_
#define MSCCLPP_SEMAPHORE_DEVICE_HPP_

#include "device.hpp"
#if defined(MSCCLPP_DEVICE_COMPILE)
#include "atomic_device.hpp"
#endif

namespace mscclpp {

/// A semaphore the host (proxy) signals and a GPU thread waits on.
struct Host2DeviceSemaphoreDeviceHandle {
  uint64_t* inboundToken;
  uint64_t* expectedInboundToken;

#if defined(MSCCLPP_DEVICE_COMPILE)
  /// Non-blocking: true (and the expected value advanced) if a signal not yet consumed has arrived.
  MSCCLPP_DEVICE_INLINE bool poll() {
    const uint64_t next = *expectedInboundToken + 1;
    if (loadAcquireSys(inboundToken) >= next) {
      *expectedInboundToken = next;
      return true;
    }
    return false;
  }

  /// Wait for the next signal; memory the signaller wrote before signalling is visible afterwards.
  /// maxSpin < 0 uses MSCCLPP_DEFAULT_MAX_SPIN (only with MSCCLPP_DEVICE_CHECKS).
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpin = -1) {
    const uint64_t expected = *expectedInboundToken + 1;
    *expectedInboundToken = expected;
    MSCCLPP_SPIN_UNTIL(loadAcquireSys(inboundToken) >= expected, maxSpin, "Host2DeviceSemaphore inbound token");
  }

  /// wait() without acquire ordering: the caller must fence before reading signalled data.
  MSCCLPP_DEVICE_INLINE void relaxedWait(int64_t maxSpin = -1) {
    const uint64_t expected = *expectedInboundToken + 1;
    *expectedInboundToken = expected;
    MSCCLPP_SPIN_UNTIL(loadRelaxedSys(inboundToken) >= expected, maxSpin, "Host2DeviceSemaphore inbound token");
  }
#endif
};

/// A semaphore between two GPUs (or a GPU and itself) through mapped memory.
struct MemoryDevice2DeviceSemaphoreDeviceHandle {
  uint64_t* inboundToken;
  uint64_t* remoteInboundToken;
  uint64_t* expectedInboundToken;

#if defined(MSCCLPP_DEVICE_COMPILE)
  /// Signal the peer: ONE fire-and-forget `red.release.sys.global.add.u64 [remoteInboundToken], 1`
  /// (HIP: a discarded release fetch-add). Every memory operation this thread performed (or
  /// observed, e.g. through a preceding __syncthreads) before the call is visible to the peer
  /// once its wait() returns.
  MSCCLPP_DEVICE_INLINE void signal() { redAddReleaseSys(remoteInboundToken, 1); }

  /// signal() with no ordering of earlier memory operations; the caller fences (e.g. LL packets
  /// carry their own flags, or a __threadfence_system() preceded it).
  MSCCLPP_DEVICE_INLINE void relaxedSignal() { redAddRelaxedSys(remoteInboundToken, 1); }

  /// Non-blocking: true (and the expected value advanced) if a signal not yet consumed has arrived.
  MSCCLPP_DEVICE_INLINE bool poll() {
    const uint64_t next = *expectedInboundToken + 1;
    if (loadAcquireSys(inboundToken) >= next) {
      *expectedInboundToken = next;
      return true;
    }
    return false;
  }

  /// Wait for the next signal: ++*expectedInboundToken, spin on a relaxed system-scope load of
  /// inboundToken until it reaches the expected value, then one acquire load of it. By coherence
  /// the acquire load reads a value at least as new, written by a release reduction (or a later
  /// one of its release sequence), so it synchronizes with the signal; polling relaxed saves
  /// ~0.02 us per hop on H200 (kernels/cuda/tests/signal_breakdown.cu).
  /// maxSpin < 0 uses MSCCLPP_DEFAULT_MAX_SPIN (only with MSCCLPP_DEVICE_CHECKS).
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpin = -1) {
    const uint64_t expected = *expectedInboundToken + 1;
    *expectedInboundToken = expected;
    MSCCLPP_SPIN_UNTIL(loadRelaxedSys(inboundToken) >= expected, maxSpin, "MemoryDevice2DeviceSemaphore inbound token");
    (void)loadAcquireSys(inboundToken);
  }

  /// wait() with relaxed loads: the caller fences before reading signalled data.
  MSCCLPP_DEVICE_INLINE void relaxedWait(int64_t maxSpin = -1) {
    const uint64_t expected = *expectedInboundToken + 1;
    *expectedInboundToken = expected;
    MSCCLPP_SPIN_UNTIL(loadRelaxedSys(inboundToken) >= expected, maxSpin, "MemoryDevice2DeviceSemaphore inbound token");
  }
#endif
};

}  // namespace mscclpp

#endif  // MSCCLPP_SEMAPHORE_DEVICE_HPP_
