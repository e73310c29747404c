// Device handles of memory channels: GPU threads move data to/from a peer's memory directly
// (NVLink/PCIe peer mappings) and synchronize through a MemoryDevice2DeviceSemaphore.
//
// BaseMemoryChannelDeviceHandle (size 24): semaphore @0.
// MemoryChannelDeviceHandle     (size 48): semaphore @0, dst @24, src @32, packetBuffer @40.
//   dst:          the peer's registered buffer, mapped here (remote).
//   src:          this rank's local buffer.
//   packetBuffer: this rank's local packet buffer, which the peer's putPackets writes into (the
//                 peer's `dst` is this buffer when the channel carries packets). May be null.
//
// Semantics (same as upstream MemoryChannel; "target" = the dst/packet side, "origin" = src):
//   put(targetOffset, originOffset, bytes, ...)   src+originOffset  -> dst+targetOffset  (remote write)
//   get(targetOffset, originOffset, bytes, ...)   dst+targetOffset  -> src+originOffset  (remote read)
//   putPackets<P>(targetOffset, originOffset, bytes, ..., flag)
//        data at src+originOffset -> packets at dst+targetOffset (the peer's packet buffer)
//   unpackPackets<P>(targetOffset, originOffset, bytes, ..., flag)
//        packets at packetBuffer+targetOffset (local) -> data at src+originOffset, waiting for flags
//   unpackPacket<P>(index, flag): the payload of packet `index` of the local packet buffer.
// put/get/putPackets/unpackPackets are cooperative: all numThreads threads call them with the same
// arguments. Offsets and byte counts are in bytes; put/get need multiples of 4 (fast path when
// both sides are congruent modulo 16); packets need multiples of the payload (8 LL16, 4 LL8).
// signal()/wait()/poll() follow MemoryDevice2DeviceSemaphoreDeviceHandle: one thread per handle.
#ifndef MSCCLPP_MEMORY_CHANNEL_DEVICE_HPP_
#define MSCCLPP_MEMORY_CHANNEL_DEVICE_HPP_

#include "copy_device.hpp"
#include "packet_device.hpp"
#include "semaphore_device.hpp"

namespace mscclpp {

struct BaseMemoryChannelDeviceHandle {
  MemoryDevice2DeviceSemaphoreDeviceHandle semaphore;

#if defined(MSCCLPP_DEVICE_COMPILE)
  MSCCLPP_DEVICE_INLINE void signal() { semaphore.signal(); }
  MSCCLPP_DEVICE_INLINE void relaxedSignal() { semaphore.relaxedSignal(); }
  MSCCLPP_DEVICE_INLINE bool poll() { return semaphore.poll(); }
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpin = -1) { semaphore.wait(maxSpin); }
  MSCCLPP_DEVICE_INLINE void relaxedWait(int64_t maxSpin = -1) { semaphore.relaxedWait(maxSpin); }
#endif
};

struct MemoryChannelDeviceHandle {
  MemoryDevice2DeviceSemaphoreDeviceHandle semaphore;
  void* dst;
  void* src;
  void* packetBuffer;

#if defined(MSCCLPP_DEVICE_COMPILE)
  /// Load element `index` of type T from the remote buffer.
  template <typename T>
  MSCCLPP_DEVICE_INLINE T read(uint64_t index) const {
    return reinterpret_cast<const T*>(dst)[index];
  }

  /// Store `v` as element `index` of type T of the remote buffer.
  template <typename T>
  MSCCLPP_DEVICE_INLINE void write(uint64_t index, const T& v) {
    reinterpret_cast<T*>(dst)[index] = v;
  }

  MSCCLPP_DEVICE_INLINE void put(uint64_t targetOffset, uint64_t originOffset, uint64_t bytes, uint32_t threadId,
                                 uint32_t numThreads) {
    copy(reinterpret_cast<char*>(dst) + targetOffset, reinterpret_cast<const char*>(src) + originOffset, bytes,
         threadId, numThreads);
  }
  MSCCLPP_DEVICE_INLINE void put(uint64_t offset, uint64_t bytes, uint32_t threadId, uint32_t numThreads) {
    put(offset, offset, bytes, threadId, numThreads);
  }

  MSCCLPP_DEVICE_INLINE void get(uint64_t targetOffset, uint64_t originOffset, uint64_t bytes, uint32_t threadId,
                                 uint32_t numThreads) {
    copy(reinterpret_cast<char*>(src) + originOffset, reinterpret_cast<const char*>(dst) + targetOffset, bytes,
         threadId, numThreads);
  }
  MSCCLPP_DEVICE_INLINE void get(uint64_t offset, uint64_t bytes, uint32_t threadId, uint32_t numThreads) {
    get(offset, offset, bytes, threadId, numThreads);
  }

  template <typename PacketType = LL16Packet>
  MSCCLPP_DEVICE_INLINE void putPackets(uint64_t targetOffset, uint64_t originOffset, uint64_t bytes,
                                        uint32_t threadId, uint32_t numThreads, uint32_t flag) {
    copyToPackets<PacketType>(reinterpret_cast<char*>(dst) + targetOffset,
                              reinterpret_cast<const char*>(src) + originOffset, bytes, threadId, numThreads, flag);
  }

  template <typename PacketType = LL16Packet>
  MSCCLPP_DEVICE_INLINE void unpackPackets(uint64_t targetOffset, uint64_t originOffset, uint64_t bytes,
                                           uint32_t threadId, uint32_t numThreads, uint32_t flag,
                                           int64_t maxSpin = -1) {
    copyFromPackets<PacketType>(reinterpret_cast<char*>(src) + originOffset,
                                reinterpret_cast<const char*>(packetBuffer) + targetOffset, bytes, threadId,
                                numThreads, flag, maxSpin);
  }

  template <typename PacketType = LL16Packet>
  MSCCLPP_DEVICE_INLINE typename PacketType::Payload unpackPacket(uint64_t index, uint32_t flag,
                                                                  int64_t maxSpin = -1) const {
    return reinterpret_cast<const PacketType*>(packetBuffer)[index].read(flag, maxSpin);
  }

  MSCCLPP_DEVICE_INLINE void signal() { semaphore.signal(); }
  MSCCLPP_DEVICE_INLINE void relaxedSignal() { semaphore.relaxedSignal(); }
  MSCCLPP_DEVICE_INLINE bool poll() { return semaphore.poll(); }
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpin = -1) { semaphore.wait(maxSpin); }
  MSCCLPP_DEVICE_INLINE void relaxedWait(int64_t maxSpin = -1) { semaphore.relaxedWait(maxSpin); }
#endif
};

}  // namespace mscclpp

#endif  // MSCCLPP_MEMORY_CHANNEL_DEVICE_HPP_
