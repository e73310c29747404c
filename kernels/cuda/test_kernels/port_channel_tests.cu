// PortChannel test kernels (code object "port_channel_tests"). The host proxy must be running
// (ProxyService) for these kernels to make progress.
//
// Rounds and data checks as in memory_channel_tests.cu: round r is sent by the initiator when r is
// even, else by the other rank; each round is one one-way hop (host divides by `iters`); `check`
// = 1 fills/verifies testPattern(seed, round, i) and adds mismatches to *errorCount. Launch with 1
// block (any blockDim) on each rank. Every kernel ends with a flush() by thread 0, so no request of
// this rank is still pending in the proxy when it returns.
//
// extern "C" __global__ void port_channel_ping_pong(
//     PortChannelDeviceHandle ch, uint32_t* buff, uint64_t nElem, int iters, int initiator,
//     int usePoll, uint64_t seed, int check, int* errorCount);
//   buff: this rank's data buffer = the memory `ch.src` names (the peer's is `ch.dst`).
//   Sender: fill buff ; thread 0 putWithSignal(0, 0, nElem*4) (signal() alone if nElem == 0).
//   Receiver: thread 0 wait() (usePoll = 1: spin on poll()) ; verify buff.
//
// extern "C" __global__ void port_channel_packet_ping_pong(
//     PortChannelDeviceHandle ch, uint32_t* buff, void* packetBuffer, uint64_t nElem, int iters,
//     int initiator, uint32_t flagBase, uint64_t seed, int check, int* errorCount);
//   LL16 packets moved by the proxy, no semaphore. packetBuffer: this rank's packet memory, named
//   by ch.src here and by ch.dst on the peer, 2 * P bytes with P = nElem * 8 (nElem even):
//   [0, P) receives the peer's packets, [P, 2P) stages outgoing ones. flag = flagBase + r + 1
//   (see memory_channel_tests.cu).
//   Sender: fill buff ; copyToPackets(packetBuffer + P, buff) ; thread 0 put(0, P, P).
//   Receiver: copyFromPackets(buff, packetBuffer) ; verify.
//
// extern "C" __global__ void port_channel_put_bandwidth(
//     PortChannelDeviceHandle ch, uint64_t bytes, uint64_t chunkBytes, int iters, int role);
//   One thread. role 1 (sender): `iters` times put [0, bytes) in chunkBytes pieces (same offset
//   on both sides), then signal() and flush(). role 0 (receiver): wait() once. role 2 (both
//   directions): send as role 1, then wait() once. bytes and chunkBytes < 2^32.
#include <mscclpp/packet_device.hpp>
#include <mscclpp/port_channel_device.hpp>

#include "test_pattern.hpp"

using mscclpp::LL16Packet;
using mscclpp::PortChannelDeviceHandle;

__device__ __forceinline__ bool isSender(int round, int initiator) { return ((round & 1) == 0) == (initiator != 0); }

extern "C" __global__ void __launch_bounds__(1024) port_channel_ping_pong(PortChannelDeviceHandle ch, uint32_t* buff, uint64_t nElem, int iters,
                                                  int initiator, int usePoll, uint64_t seed, int check,
                                                  int* errorCount) {
  const uint64_t bytes = nElem * sizeof(uint32_t);
  for (int r = 0; r < iters; ++r) {
    if (isSender(r, initiator)) {
      if (check) fillPattern(buff, nElem, seed, (uint32_t)r);
      __syncthreads();
      if (threadIdx.x == 0) {
        if (bytes > 0) {
          ch.putWithSignal(0, 0, bytes);
        } else {
          ch.signal();
        }
      }
    } else {
      if (threadIdx.x == 0) {
        waitOrPoll(ch, usePoll, "port_channel_ping_pong: poll never succeeded");
      }
      __syncthreads();
      if (check) checkPattern(buff, nElem, seed, (uint32_t)r, errorCount);
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) ch.flush();
}

extern "C" __global__ void __launch_bounds__(1024) port_channel_packet_ping_pong(PortChannelDeviceHandle ch, uint32_t* buff,
                                                         void* packetBuffer, uint64_t nElem, int iters, int initiator,
                                                         uint32_t flagBase, uint64_t seed, int check,
                                                         int* errorCount) {
  const uint64_t bytes = nElem * sizeof(uint32_t);
  const uint64_t packetBytes = nElem * 8;
  char* recvArea = reinterpret_cast<char*>(packetBuffer);
  char* stageArea = recvArea + packetBytes;
  for (int r = 0; r < iters; ++r) {
    const uint32_t flag = flagBase + (uint32_t)r + 1;
    if (isSender(r, initiator)) {
      if (check) fillPattern(buff, nElem, seed, (uint32_t)r);
      __syncthreads();
      mscclpp::copyToPackets<LL16Packet>(stageArea, buff, bytes, threadIdx.x, blockDim.x, flag);
      __syncthreads();
      if (threadIdx.x == 0) ch.put(0, packetBytes, packetBytes);
    } else {
      mscclpp::copyFromPackets<LL16Packet>(buff, recvArea, bytes, threadIdx.x, blockDim.x, flag);
      __syncthreads();
      if (check) checkPattern(buff, nElem, seed, (uint32_t)r, errorCount);
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) ch.flush();
}

extern "C" __global__ void __launch_bounds__(1024) port_channel_put_bandwidth(PortChannelDeviceHandle ch, uint64_t bytes, uint64_t chunkBytes,
                                                      int iters, int role) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (role != 0) {
    for (int i = 0; i < iters; ++i) {
      for (uint64_t off = 0; off < bytes; off += chunkBytes) {
        const uint64_t n = (bytes - off < chunkBytes) ? (bytes - off) : chunkBytes;
        ch.put(off, off, n);
      }
    }
    ch.signal();
    ch.flush();
  }
  if (role != 1) ch.wait();
}
