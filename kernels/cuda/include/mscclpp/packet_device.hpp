// LL ("low latency") packets: data travels with a flag in the same single-copy-atomic word, so a
// reader needs no separate signal. A reader spins until the flag it expects appears.
//
// LL16Packet (size 16, align 16): data1 @0, flag1 @4, data2 @8, flag2 @12. 8 data bytes per packet.
//   Written with one 16-byte store (CUDA: st.relaxed.sys.global.v2.u64, each u64 = data|flag<<32,
//   one STG.E.128); read with one 16-byte load; valid when flag1 == flag2 == expected. Each u64
//   half holds its own flag, so 8-byte atomicity is all that is assumed (also for IB/copy-engine
//   writers). HIP: two relaxed system-scope u64 atomic stores/loads.
// LL8Packet (size 8, align 8): data @0, flag @4. 4 data bytes per packet, one u64 store/load.
//
// copyToPackets<P>(packets, data, dataBytes, threadId, numThreads, flag): data -> packets.
// copyFromPackets<P>(data, packets, dataBytes, threadId, numThreads, flag, maxSpin): packets -> data,
//   waiting for each packet's flag. dataBytes: multiple of 8 (LL16) or 4 (LL8); data aligned the same.
//   Packet buffers need dataBytes * 2 bytes. Flags must change between uses of a buffer (e.g. round+1)
//   and never be 0 if the buffer starts zeroed.
#ifndef MSCCLPP_PACKET_DEVICE_HPP_
#define MSCCLPP_PACKET_DEVICE_HPP_

#include "device.hpp"
#if defined(MSCCLPP_DEVICE_COMPILE)
#include "atomic_device.hpp"
#endif

namespace mscclpp {

union alignas(16) LL16Packet {
  struct {
    uint32_t data1;
    uint32_t flag1;
    uint32_t data2;
    uint32_t flag2;
  };
  uint64_t raw[2];

#if defined(MSCCLPP_DEVICE_COMPILE)
  /// Payload type: two u32.
  using Payload = uint2;
  static constexpr uint32_t PayloadBytes = 8;

  MSCCLPP_DEVICE_INLINE void write(uint32_t v1, uint32_t v2, uint32_t flag) {
    store128RelaxedSys(raw, ((uint64_t)flag << 32) | v1, ((uint64_t)flag << 32) | v2);
  }
  MSCCLPP_DEVICE_INLINE void write(uint2 v, uint32_t flag) { write(v.x, v.y, flag); }

  /// One attempt: true and `out` filled if both flags equal `flag`.
  MSCCLPP_DEVICE_INLINE bool readOnce(uint32_t flag, uint2& out) const {
    uint64_t lo, hi;
    load128RelaxedSys(raw, lo, hi);
    out.x = (uint32_t)lo;
    out.y = (uint32_t)hi;
    return (uint32_t)(lo >> 32) == flag && (uint32_t)(hi >> 32) == flag;
  }

  /// Spin until the packet carries `flag`; return its data.
  MSCCLPP_DEVICE_INLINE uint2 read(uint32_t flag, int64_t maxSpin = -1) const {
    uint2 out;
    MSCCLPP_SPIN_UNTIL(readOnce(flag, out), maxSpin, "LL16 packet flag");
    return out;
  }
#endif
};

union alignas(8) LL8Packet {
  struct {
    uint32_t data;
    uint32_t flag;
  };
  uint64_t raw;

#if defined(MSCCLPP_DEVICE_COMPILE)
  using Payload = uint32_t;
  static constexpr uint32_t PayloadBytes = 4;

  MSCCLPP_DEVICE_INLINE void write(uint32_t v, uint32_t flag) { store64RelaxedSys(&raw, ((uint64_t)flag << 32) | v); }

  MSCCLPP_DEVICE_INLINE bool readOnce(uint32_t flag, uint32_t& out) const {
    const uint64_t r = load64RelaxedSys(&raw);
    out = (uint32_t)r;
    return (uint32_t)(r >> 32) == flag;
  }

  MSCCLPP_DEVICE_INLINE uint32_t read(uint32_t flag, int64_t maxSpin = -1) const {
    uint32_t out;
    MSCCLPP_SPIN_UNTIL(readOnce(flag, out), maxSpin, "LL8 packet flag");
    return out;
  }
#endif
};

#if defined(MSCCLPP_DEVICE_COMPILE)

/// Pack `dataBytes` of `data` into packets carrying `flag`. All numThreads threads call it.
template <typename PacketType = LL16Packet>
MSCCLPP_DEVICE_INLINE void copyToPackets(void* packets, const void* data, uint64_t dataBytes, uint32_t threadId,
                                         uint32_t numThreads, uint32_t flag) {
  using Payload = typename PacketType::Payload;
  PacketType* dst = reinterpret_cast<PacketType*>(packets);
  const Payload* src = reinterpret_cast<const Payload*>(data);
  const uint64_t n = dataBytes / sizeof(Payload);
  for (uint64_t i = threadId; i < n; i += numThreads) {
    dst[i].write(src[i], flag);
  }
}

/// Unpack `dataBytes` of data from packets, waiting for each to carry `flag`. All numThreads threads call it.
template <typename PacketType = LL16Packet>
MSCCLPP_DEVICE_INLINE void copyFromPackets(void* data, const void* packets, uint64_t dataBytes, uint32_t threadId,
                                           uint32_t numThreads, uint32_t flag, int64_t maxSpin = -1) {
  using Payload = typename PacketType::Payload;
  const PacketType* src = reinterpret_cast<const PacketType*>(packets);
  Payload* dst = reinterpret_cast<Payload*>(data);
  const uint64_t n = dataBytes / sizeof(Payload);
  for (uint64_t i = threadId; i < n; i += numThreads) {
    dst[i] = src[i].read(flag, maxSpin);
  }
}

#endif  // defined(MSCCLPP_DEVICE_COMPILE)

}  // namespace mscclpp

#endif  // MSCCLPP_PACKET_DEVICE_HPP_
