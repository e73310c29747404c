// Device handles of port channels: GPU threads push requests into the proxy FIFO; the host proxy
// performs the transfers (copy engine, IB, Ethernet) and signals the peer's semaphore. Incoming
// signals arrive through a Host2DeviceSemaphore.
//
// BasePortChannelDeviceHandle (size 64): semaphoreId @0, pad @4, semaphore @8 (Host2Device, 16 B),
//                                        fifo @24 (FifoDeviceHandle, 40 B).
// PortChannelDeviceHandle     (size 72): base @0 (BasePortChannelDeviceHandle, a nested member,
//                                        not flattened), dst @64, src @68 (memory ids of the
//                                        proxy's registered memories).
//
// Operations (any thread; each is one FIFO push unless noted):
//   put(dstOffset, srcOffset, size)        TriggerData
//   signal()                               TriggerFlag (the proxy signals the peer after earlier puts)
//   putWithSignal(...)                     TriggerData | TriggerFlag
//   putWithSignalAndFlush(...)             TriggerData | TriggerFlag | TriggerSync, then fifo.sync(pos)
//   flush()                                TriggerSync, then fifo.sync(pos): all earlier requests done
//   wait() / poll()                        the Host2Device semaphore (one thread per handle)
//   fifo.failedTriggers()                  requests the proxy failed so far (compare before/after)
// Offsets and sizes must be < 2^32 (trigger fields); memory ids < 512; semaphore ids < 1024.
#ifndef MSCCLPP_PORT_CHANNEL_DEVICE_HPP_
#define MSCCLPP_PORT_CHANNEL_DEVICE_HPP_

#include "fifo_device.hpp"
#include "semaphore_device.hpp"

namespace mscclpp {

using MemoryId = uint32_t;
using SemaphoreId = uint32_t;

struct BasePortChannelDeviceHandle {
  SemaphoreId semaphoreId;
  uint32_t pad;
  Host2DeviceSemaphoreDeviceHandle semaphore;
  FifoDeviceHandle fifo;

#if defined(MSCCLPP_DEVICE_COMPILE)
  MSCCLPP_DEVICE_INLINE uint64_t push(TriggerType type, MemoryId dst, uint64_t dstOffset, MemoryId src,
                                      uint64_t srcOffset, uint64_t size) {
    MSCCLPP_DEVICE_CHECK(((dstOffset | srcOffset | size) >> 32) == 0, "port channel: offsets and size must be < 2^32");
    return fifo.push(makeProxyTrigger(type, dst, dstOffset, src, srcOffset, size, semaphoreId));
  }

  MSCCLPP_DEVICE_INLINE void put(MemoryId dst, uint64_t dstOffset, MemoryId src, uint64_t srcOffset, uint64_t size) {
    push(TriggerData, dst, dstOffset, src, srcOffset, size);
  }
  MSCCLPP_DEVICE_INLINE void put(MemoryId dst, MemoryId src, uint64_t offset, uint64_t size) {
    put(dst, offset, src, offset, size);
  }

  MSCCLPP_DEVICE_INLINE void signal() { push(TriggerFlag, 0, 0, 0, 0, 0); }

  MSCCLPP_DEVICE_INLINE void putWithSignal(MemoryId dst, uint64_t dstOffset, MemoryId src, uint64_t srcOffset,
                                           uint64_t size) {
    push(TriggerData | TriggerFlag, dst, dstOffset, src, srcOffset, size);
  }

  MSCCLPP_DEVICE_INLINE void putWithSignalAndFlush(MemoryId dst, uint64_t dstOffset, MemoryId src,
                                                   uint64_t srcOffset, uint64_t size, int64_t maxSpin = -1) {
    const uint64_t pos = push(TriggerData | TriggerFlag | TriggerSync, dst, dstOffset, src, srcOffset, size);
    fifo.sync(pos, maxSpin);
  }

  MSCCLPP_DEVICE_INLINE void flush(int64_t maxSpin = -1) {
    const uint64_t pos = push(TriggerSync, 0, 0, 0, 0, 0);
    fifo.sync(pos, maxSpin);
  }

  MSCCLPP_DEVICE_INLINE bool poll() { return semaphore.poll(); }
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpin = -1) { semaphore.wait(maxSpin); }
#endif
};

struct PortChannelDeviceHandle {
  BasePortChannelDeviceHandle base;
  MemoryId dst;
  MemoryId src;

#if defined(MSCCLPP_DEVICE_COMPILE)
  MSCCLPP_DEVICE_INLINE void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t size) {
    base.put(dst, dstOffset, src, srcOffset, size);
  }
  MSCCLPP_DEVICE_INLINE void put(uint64_t offset, uint64_t size) { put(offset, offset, size); }

  MSCCLPP_DEVICE_INLINE void signal() { base.signal(); }

  MSCCLPP_DEVICE_INLINE void putWithSignal(uint64_t dstOffset, uint64_t srcOffset, uint64_t size) {
    base.putWithSignal(dst, dstOffset, src, srcOffset, size);
  }
  MSCCLPP_DEVICE_INLINE void putWithSignal(uint64_t offset, uint64_t size) { putWithSignal(offset, offset, size); }

  MSCCLPP_DEVICE_INLINE void putWithSignalAndFlush(uint64_t dstOffset, uint64_t srcOffset, uint64_t size,
                                                   int64_t maxSpin = -1) {
    base.putWithSignalAndFlush(dst, dstOffset, src, srcOffset, size, maxSpin);
  }
  MSCCLPP_DEVICE_INLINE void putWithSignalAndFlush(uint64_t offset, uint64_t size) {
    putWithSignalAndFlush(offset, offset, size);
  }

  MSCCLPP_DEVICE_INLINE void flush(int64_t maxSpin = -1) { base.flush(maxSpin); }
  MSCCLPP_DEVICE_INLINE bool poll() { return base.poll(); }
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpin = -1) { base.wait(maxSpin); }
#endif
};

}  // namespace mscclpp

#endif  // MSCCLPP_PORT_CHANNEL_DEVICE_HPP_
