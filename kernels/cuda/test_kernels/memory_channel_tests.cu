// MemoryChannel test kernels (code object "memory_channel_tests").
//
// Buffers: ch.src = this rank's data buffer (u32 elements), ch.dst = the peer's data buffer (for
// put/get) or the peer's packet buffer (for packets), ch.packetBuffer = this rank's packet buffer.
// Data patterns: testPattern(seed, round, i) from test_pattern.hpp (mirrored on the Rust side).
// Rounds: round r (0-based) is sent by the initiator when r is even, by the other rank when odd;
// each round is one one-way hop, so the host divides the elapsed time by `iters`.
// `check`: 1 = the sender fills the pattern and the receiver verifies every element, adding the
// number of mismatches to *errorCount; 0 = data is moved but not generated or checked (latency).
// Launch ping-pong kernels with 1 block (any blockDim up to 1024, the same on both ranks) on each
// rank. All kernels here are compiled with __launch_bounds__(1024).
//
// extern "C" __global__ void memory_channel_put_ping_pong(
//     MemoryChannelDeviceHandle ch, uint64_t offset /*bytes, multiple of 4*/, uint64_t nElem,
//     int iters, int initiator, uint64_t seed, int check, int* errorCount);
//   Sender: fill src[offset..] ; put(offset, offset, nElem*4) ; signal. Receiver: wait ; verify src[offset..].
//
// extern "C" __global__ void memory_channel_get_ping_pong(
//     MemoryChannelDeviceHandle ch, uint64_t offset, uint64_t nElem, int iters, int initiator,
//     uint64_t seed, int check, int* errorCount);
//   Producer: fill its own src[offset..] ; signal. Consumer: wait ; get(offset, offset, nElem*4)
//   from the producer's buffer into its own src ; verify. (The next round's signal, sent after the
//   consumer finished reading, is what lets the old producer write its buffer again.)
//
// extern "C" __global__ void memory_channel_ll8_ping_pong(
//     MemoryChannelDeviceHandle ch, uint64_t nElem, int iters, int initiator, uint32_t flagBase,
//     uint64_t seed, int check, int* errorCount);
// extern "C" __global__ void memory_channel_ll16_ping_pong(same arguments);   nElem even
//   flag of round r = flagBase + r + 1. Pass 0 for the first launch on zeroed packet buffers and,
//   for later launches on the same buffers, the number of rounds already run (so no stale packet
//   can carry an expected flag).
//   Sender: fill src ; putPackets<P>(0, 0, nElem*4, ..., flag) into the peer's packet buffer.
//   Receiver: unpackPackets<P>(0, 0, nElem*4, ..., flag) from its own packet buffer into src ;
//   verify. Packet buffers: nElem * 8 bytes for both LL8 (8 B per element) and LL16 (16 B per two).
//
// extern "C" __global__ void memory_channel_put_bandwidth(
//     MemoryChannelDeviceHandle ch, uint64_t bytes, int iters, int role, int peerBlocks);
//   role 1 (sender, any grid): all threads of the grid put(0, 0, bytes) `iters` times; then each
//     block's thread 0 signals once; then block 0 thread 0 waits for the receiver's acknowledgement.
//   role 0 (receiver, 1 thread): wait peerBlocks times (peerBlocks = the sender's gridDim.x), then
//     signal once (the acknowledgement).
//   role 2 (both directions at once, same grid on both ranks): put as a sender, each block signals
//     once, then block 0 thread 0 waits peerBlocks times.
//   Bytes moved per rank = bytes * iters; time the sender's kernel.
#include <mscclpp/memory_channel_device.hpp>

#include "test_pattern.hpp"

using mscclpp::LL16Packet;
using mscclpp::LL8Packet;
using mscclpp::MemoryChannelDeviceHandle;

__device__ __forceinline__ bool isSender(int round, int initiator) { return ((round & 1) == 0) == (initiator != 0); }

/// The put / get ping-pong: the sender fills its buffer and signals, after putting it into the
/// receiver's (`Get` false); or the receiver gets the sender's buffer after the signal (`Get`).
template <bool Get>
__device__ __forceinline__ void copyPingPong(MemoryChannelDeviceHandle& ch, uint64_t offset, uint64_t nElem,
                                             int iters, int initiator, uint64_t seed, int check, int* errorCount) {
  uint32_t* buff = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(ch.src) + offset);
  const uint64_t bytes = nElem * sizeof(uint32_t);
  for (int r = 0; r < iters; ++r) {
    if (isSender(r, initiator)) {
      if (check) fillPattern(buff, nElem, seed, (uint32_t)r);
      __syncthreads();
      if (!Get) {
        ch.put(offset, offset, bytes, threadIdx.x, blockDim.x);
        __syncthreads();
      }
      if (threadIdx.x == 0) ch.signal();
    } else {
      if (threadIdx.x == 0) ch.wait();
      __syncthreads();
      if (Get) {
        ch.get(offset, offset, bytes, threadIdx.x, blockDim.x);
        __syncthreads();
      }
      if (check) checkPattern(buff, nElem, seed, (uint32_t)r, errorCount);
      __syncthreads();
    }
  }
}

extern "C" __global__ void __launch_bounds__(1024) memory_channel_put_ping_pong(MemoryChannelDeviceHandle ch, uint64_t offset, uint64_t nElem,
                                                        int iters, int initiator, uint64_t seed, int check,
                                                        int* errorCount) {
  copyPingPong<false>(ch, offset, nElem, iters, initiator, seed, check, errorCount);
}

extern "C" __global__ void __launch_bounds__(1024) memory_channel_get_ping_pong(MemoryChannelDeviceHandle ch, uint64_t offset, uint64_t nElem,
                                                        int iters, int initiator, uint64_t seed, int check,
                                                        int* errorCount) {
  copyPingPong<true>(ch, offset, nElem, iters, initiator, seed, check, errorCount);
}

template <typename PacketType>
__device__ __forceinline__ void packetPingPong(MemoryChannelDeviceHandle& ch, uint64_t nElem, int iters,
                                               int initiator, uint32_t flagBase, uint64_t seed, int check,
                                               int* errorCount) {
  uint32_t* buff = reinterpret_cast<uint32_t*>(ch.src);
  const uint64_t bytes = nElem * sizeof(uint32_t);
  for (int r = 0; r < iters; ++r) {
    const uint32_t flag = flagBase + (uint32_t)r + 1;
    if (isSender(r, initiator)) {
      if (check) {
        fillPattern(buff, nElem, seed, (uint32_t)r);
        __syncthreads();
      }
      ch.putPackets<PacketType>(0, 0, bytes, threadIdx.x, blockDim.x, flag);
    } else {
      ch.unpackPackets<PacketType>(0, 0, bytes, threadIdx.x, blockDim.x, flag);
      if (check) {
        __syncthreads();
        checkPattern(buff, nElem, seed, (uint32_t)r, errorCount);
      }
    }
    // Without a data check each thread reads/writes only its own elements, so no barrier is needed:
    // a thread's next send follows its own receive of the previous round.
    if (check) __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(1024) memory_channel_ll8_ping_pong(MemoryChannelDeviceHandle ch, uint64_t nElem, int iters,
                                                        int initiator, uint32_t flagBase, uint64_t seed, int check,
                                                        int* errorCount) {
  packetPingPong<LL8Packet>(ch, nElem, iters, initiator, flagBase, seed, check, errorCount);
}

extern "C" __global__ void __launch_bounds__(1024) memory_channel_ll16_ping_pong(MemoryChannelDeviceHandle ch, uint64_t nElem, int iters,
                                                        int initiator, uint32_t flagBase, uint64_t seed, int check,
                                                        int* errorCount) {
  packetPingPong<LL16Packet>(ch, nElem, iters, initiator, flagBase, seed, check, errorCount);
}

extern "C" __global__ void __launch_bounds__(1024) memory_channel_put_bandwidth(MemoryChannelDeviceHandle ch, uint64_t bytes, int iters,
                                                        int role, int peerBlocks) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t nThreads = gridDim.x * blockDim.x;
  if (role == 0) {
    if (tid != 0) return;
    for (int b = 0; b < peerBlocks; ++b) ch.wait();
    ch.signal();
    return;
  }
  for (int i = 0; i < iters; ++i) ch.put(0, 0, bytes, tid, nThreads);
  __syncthreads();
  if (threadIdx.x == 0) ch.signal();
  if (tid == 0) {
    if (role == 1) {
      ch.wait();
    } else {
      for (int b = 0; b < peerBlocks; ++b) ch.wait();
    }
  }
}
