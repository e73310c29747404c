// The device side of the proxy FIFO: GPU threads push 16-byte triggers, the host proxy pops them.
//
// ProxyTrigger (size 16, align 16): fst @0, snd @8.
//   fst = size[0,32) | srcOffset[32,64)
//   snd = dstOffset[0,32) | srcMemoryId[32,41) | dstMemoryId[41,50) | type[50,53) |
//         semaphoreId[53,63) | commit[63]
//   type bits (combinable): TriggerData = 1, TriggerFlag = 2, TriggerSync = 4.
//   commit = lap parity of the slot's position: 1 on lap 0 (pos / size even), 0 on lap 1, ...
//   so the host, which starts from zeroed slots, can tell a fresh trigger from last lap's.
//
// FifoDeviceHandle (size 40, align 8): triggers @0, head @8, tail @16, tailCache @24, size @32,
//   pad @36.
//   triggers:  `size` slots in host-mapped memory, 16-byte aligned.
//   head:      device memory; number of positions handed out (fetch-added by pushers).
//   tail:      host-mapped; number of triggers the host has handled. The host release-stores
//              tail + 1 after it has finished with a trigger (for Sync: after the flush).
//   tail[1]:   host-mapped, the word after tail: the number of triggers the host failed to carry
//              out (incremented before the failed trigger is popped). A thread that saw
//              tail > pos and reads failedTriggers() above the value it read before pushing knows
//              a request up to pos failed; the host API says which (ProxyService::last_error).
//   tailCache: device memory; a recent value of tail, so pushers rarely read over PCIe.
//   size:      number of slots, a power of two.
//
// Publishing a trigger (push): on CUDA one `st.release.sys.global.b128` (PTX ISA 8.3+, sm_70+):
// a single 128-bit scalar access after a system-scope release fence (SASS: MEMBAR.SYS; STG.E.128).
// We prefer .b128 to upstream's `st.release.sys.v2.u64` because the PTX memory model treats a
// vector access as separate element accesses in unspecified order, whereas .b128 is one access;
// both compile to the same single STG.E.128, so there is no cost. The host reads snd (acquire),
// checks the commit bit, then reads fst: this relies on the aligned 16-byte write reaching host
// memory as one unit (one PCIe write), the same assumption upstream makes. Where .b128 is not
// available (CUDA < 12.3) and on HIP (no 128-bit atomic store) we store fst relaxed and then snd
// (which holds the commit bit) with release, which is correct under the memory model alone.
#ifndef MSCCLPP_FIFO_DEVICE_HPP_
#define MSCCLPP_FIFO_DEVICE_HPP_

#include "device.hpp"
#if defined(MSCCLPP_DEVICE_COMPILE)
#include "atomic_device.hpp"
#endif

namespace mscclpp {

using TriggerType = uint64_t;
constexpr TriggerType TriggerData = 0x1;  ///< copy `size` bytes src -> dst
constexpr TriggerType TriggerFlag = 0x2;  ///< signal the semaphore `semaphoreId`
constexpr TriggerType TriggerSync = 0x4;  ///< flush the connection, then pop (the GPU may wait on it)

constexpr unsigned TriggerBitsSize = 32;
constexpr unsigned TriggerBitsOffset = 32;
constexpr unsigned TriggerBitsMemoryId = 9;
constexpr unsigned TriggerBitsType = 3;
constexpr unsigned TriggerBitsSemaphoreId = 10;
constexpr unsigned TriggerShiftSrcMemoryId = 32;
constexpr unsigned TriggerShiftDstMemoryId = 41;
constexpr unsigned TriggerShiftType = 50;
constexpr unsigned TriggerShiftSemaphoreId = 53;
constexpr unsigned TriggerShiftCommit = 63;
constexpr uint64_t TriggerCommitBit = 1ull << TriggerShiftCommit;
constexpr uint32_t MaxMemoryId = (1u << TriggerBitsMemoryId) - 1;
constexpr uint32_t MaxSemaphoreId = (1u << TriggerBitsSemaphoreId) - 1;

/// One FIFO slot.
struct alignas(16) ProxyTrigger {
  uint64_t fst;
  uint64_t snd;
};

/// Pack a trigger (commit bit clear; push() sets it). Fields wider than their bit ranges are
/// truncated: callers keep size/offsets < 2^32, memory ids < 512 and semaphore ids < 1024.
MSCCLPP_HOST_DEVICE_INLINE ProxyTrigger makeProxyTrigger(TriggerType type, uint32_t dstMemoryId, uint64_t dstOffset,
                                                         uint32_t srcMemoryId, uint64_t srcOffset, uint64_t size,
                                                         uint32_t semaphoreId) {
  ProxyTrigger t;
  t.fst = (size & 0xffffffffull) | ((srcOffset & 0xffffffffull) << 32);
  t.snd = (dstOffset & 0xffffffffull) | ((uint64_t)(srcMemoryId & MaxMemoryId) << TriggerShiftSrcMemoryId) |
          ((uint64_t)(dstMemoryId & MaxMemoryId) << TriggerShiftDstMemoryId) |
          ((type & ((1ull << TriggerBitsType) - 1)) << TriggerShiftType) |
          ((uint64_t)(semaphoreId & MaxSemaphoreId) << TriggerShiftSemaphoreId);
  return t;
}

/// The commit bit a trigger at FIFO position `pos` carries (size is a power of two).
MSCCLPP_HOST_DEVICE_INLINE uint64_t triggerParityBit(uint64_t pos, uint32_t size) {
  return ((pos & (uint64_t)size) == 0) ? TriggerCommitBit : 0;
}

/// Device handle of a FIFO (see the file comment for the fields).
struct FifoDeviceHandle {
  ProxyTrigger* triggers;
  uint64_t* head;
  uint64_t* tail;
  uint64_t* tailCache;
  uint32_t size;
  uint32_t pad;

#if defined(MSCCLPP_DEVICE_COMPILE)
  /// Push a trigger and return its position. Any thread may call it, concurrently with others.
  /// Waits (bounded by maxSpin polls of tail, see device.hpp) while the FIFO is full.
  /// Memory operations this thread did (or observed) before push are visible to the host once it
  /// sees the trigger.
  MSCCLPP_DEVICE_INLINE uint64_t push(ProxyTrigger trigger, int64_t maxSpin = -1) {
    const uint64_t pos = fetchAddRelaxedGpu(head, 1);
    // The slot of position pos is free once the host handled position pos - size, i.e. tail > pos - size.
    if (pos - *reinterpret_cast<volatile uint64_t*>(tailCache) >= size) {
      uint64_t t;
      MSCCLPP_SPIN_UNTIL(pos - (t = loadAcquireSys(tail)) < size, maxSpin, "FIFO space (host tail)");
      maxRelaxedGpu(tailCache, t);
    }
    ProxyTrigger* slot = &triggers[pos & (uint64_t)(size - 1)];
    const uint64_t snd = (trigger.snd & ~TriggerCommitBit) | triggerParityBit(pos, size);
    store128ReleaseSys(reinterpret_cast<uint64_t*>(slot), trigger.fst, snd);
    return pos;
  }

  /// The number of triggers the host failed to carry out so far (monotonic; see tail[1] above).
  MSCCLPP_DEVICE_INLINE uint64_t failedTriggers() const { return loadAcquireSys(tail + 1); }

  /// Wait until the host has handled the trigger at position pos (tail > pos).
  MSCCLPP_DEVICE_INLINE void sync(uint64_t pos, int64_t maxSpin = -1) {
    uint64_t t;
    MSCCLPP_SPIN_UNTIL((t = loadAcquireSys(tail)) > pos, maxSpin, "FIFO sync (host tail)");
    maxRelaxedGpu(tailCache, t);
  }
#endif
};

}  // namespace mscclpp

#endif  // MSCCLPP_FIFO_DEVICE_HPP_
