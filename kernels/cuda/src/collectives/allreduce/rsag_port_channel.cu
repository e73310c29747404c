// All-reduce rsag_port_channel (core/src/collectives/allreduce/rsag_port_channel.rs has the
// protocol): reduce-scatter + all-gather whose transfers go through port channels (the host proxy
// copies on the connection: the copy engine for CudaIpc). Per chunk of n slices of S bytes, in
// grid-wide phases: 1. every block copies its part of the peers' slices of the input into scratch
// area A; 2. block 0 (thread p for peer p) puts slice p from A into slot `rank` of peer p's RS area
// with a signal and waits for peer p's signal; 3. every block reduces its part of the own slice
// (input + RS slots, rank order) into the output and area RD; 4. block 0 puts RD into slot `rank` of
// every peer's AG area with a signal and waits; 5. every block copies the peers' AG slots into the
// output. A handshake on semaphore row 0 opens the launch; a flush of every channel closes it.
// Kernels: allreduce_rsag_port_channel_<dtype>_<op>(CollArgs), extra[0] = PortChannelDeviceHandle
// table (index = peer), extra[1] = slice bytes S. Scratch: A n x S, RS n x S, AG n x S, RD S.
#include <mscclpp/port_channel_device.hpp>

#include "../mesh.hpp"

namespace mscclpp {
namespace coll {

template <typename T, int OP>
MSCCLPP_DEVICE_INLINE void rsagPortAllreduce(const CollArgs& a) {
  PortChannelDeviceHandle* chans = reinterpret_cast<PortChannelDeviceHandle*>(a.extra[0]);
  const uint64_t S = a.extra[1];
  const uint64_t total = a.count * sizeof(T);
  const int rank = a.rank, n = a.nranks, t = threadIdx.x;
  const uint64_t G = gridDim.x, b = blockIdx.x;
  const uint64_t offA = 0, offRS = (uint64_t)n * S, offAG = 2 * (uint64_t)n * S, offRD = 3 * (uint64_t)n * S;
  const uint64_t base = a.plainOffset;  // channel offsets are from the shared buffers' starts
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  char* mine = plainOf(a, rank);
  const bool proxyThread = (b == 0 && t < n && t != rank);
  const uint32_t flag = blockFlag(a);
  uint32_t passed = 0;
  __shared__ const char* srcs[kMaxRanks];
  __shared__ char* outs[1];
  if (proxyThread) {
    MemoryDevice2DeviceSemaphoreDeviceHandle& s = meshSem(a, 0, t);
    s.signal();
    s.wait();
  }
  gridBarrier(flag, passed);
  const uint64_t chunks = (total + (uint64_t)n * S - 1) / ((uint64_t)n * S);
  for (uint64_t k = 0; k < chunks; ++k) {
    const uint64_t at0 = k * n * S;
    auto len = [&](int r) -> uint64_t {
      const uint64_t at = at0 + (uint64_t)r * S;
      return at >= total ? 0 : (total - at < S ? total - at : S);
    };
    uint64_t x0, x1;
    for (int q = 1; q < n; ++q) {
      const int p = (rank + q) % n;
      blockPart(len(p), G, b, x0, x1);
      blockCopy(mine + offA + (uint64_t)p * S + x0, send + at0 + (uint64_t)p * S + x0, x1 - x0);
    }
    gridBarrier(flag, passed);
    if (proxyThread) {
      const uint64_t l = len(t);
      if (l > 0) {
        chans[t].putWithSignal(base + offRS + (uint64_t)rank * S, base + offA + (uint64_t)t * S, l);
      } else {
        chans[t].signal();
      }
      chans[t].wait();
    }
    gridBarrier(flag, passed);
    blockPart(len(rank), G, b, x0, x1);
    if (t < n) srcs[t] = (t == rank) ? send + at0 + (uint64_t)rank * S + x0 : mine + offRS + (uint64_t)t * S + x0;
    if (t == 0) outs[0] = mine + offRD + x0;
    __syncthreads();
    blockReduce<T, OP>(recv + at0 + (uint64_t)rank * S + x0, outs, 1, srcs, n, x1 - x0, n);
    gridBarrier(flag, passed);
    if (proxyThread) {
      const uint64_t l = len(rank);
      if (l > 0) {
        chans[t].putWithSignal(base + offAG + (uint64_t)rank * S, base + offRD, l);
      } else {
        chans[t].signal();
      }
      chans[t].wait();
    }
    gridBarrier(flag, passed);
    for (int q = 1; q < n; ++q) {
      const int p = (rank + q) % n;
      blockPart(len(p), G, b, x0, x1);
      blockCopy(recv + at0 + (uint64_t)p * S + x0, mine + offAG + (uint64_t)p * S + x0, x1 - x0);
    }
  }
  if (proxyThread) chans[t].flush();
  bumpFlags(a, flag);
}

}  // namespace coll
}  // namespace mscclpp

MSCCLPP_COLL_INSTANCES(allreduce_rsag_port_channel, mscclpp::coll::rsagPortAllreduce)
