// All-gather port_channel (core/src/collectives/allgather/port_channel.rs has the protocol): the
// transfers go through port channels (the host proxy copies on the connection: the copy engine for
// CudaIpc). Per chunk of C bytes of every rank's input, in grid-wide phases: block 0 shakes hands
// with every peer (semaphore row 0); every block copies its part of the chunk into scratch area A
// (and the own output slot when out of place); block 0 (thread p for peer p) puts A into slot
// `rank` of peer p's area G with a signal and waits for peer p's signal; every block copies the
// peers' G slots into the output. A flush of every channel closes the launch.
// Kernel: allgather_port_channel(CollArgs), extra[0] = PortChannelDeviceHandle table (index =
// peer), extra[1] = chunk bytes C, extra[2] = bytes per rank. Scratch: A C, G n x C.
#include <mscclpp/port_channel_device.hpp>

#include "../mesh.hpp"

using namespace mscclpp;
using namespace mscclpp::coll;

extern "C" __global__ void __launch_bounds__(1024) allgather_port_channel(CollArgs a) {
  PortChannelDeviceHandle* chans = reinterpret_cast<PortChannelDeviceHandle*>(a.extra[0]);
  const uint64_t C = a.extra[1], B = a.extra[2];
  const int rank = a.rank, n = a.nranks, t = threadIdx.x;
  const uint64_t G = gridDim.x, b = blockIdx.x;
  const uint64_t base = a.plainOffset, offG = C;
  const char* send = reinterpret_cast<const char*>(a.send);
  char* recv = reinterpret_cast<char*>(a.recv);
  char* own = recv + (uint64_t)rank * B;
  char* mine = plainOf(a, rank);
  const bool proxyThread = (b == 0 && t < n && t != rank);
  const uint32_t flag = blockFlag(a);
  uint32_t passed = 0;
  __shared__ char* dsts[2];
  for (uint64_t start = 0; start < B; start += C) {
    const uint64_t c = (B - start < C) ? B - start : C;
    uint64_t x0, x1;
    if (proxyThread) {
      MemoryDevice2DeviceSemaphoreDeviceHandle& s = meshSem(a, 0, t);
      s.signal();
      s.wait();
    }
    gridBarrier(flag, passed);
    blockPart(c, G, b, x0, x1);
    if (t == 0) {
      dsts[0] = mine + x0;
      dsts[1] = own + start + x0;
    }
    __syncthreads();
    blockCopyMulti(dsts, send == own ? 1 : 2, send + start + x0, x1 - x0);
    gridBarrier(flag, passed);
    if (proxyThread) {
      chans[t].putWithSignal(base + offG + (uint64_t)rank * C, base, c);
      chans[t].wait();
    }
    gridBarrier(flag, passed);
    for (int q = 1; q < n; ++q) {
      const int p = (rank + q) % n;
      blockCopy(recv + (uint64_t)p * B + start + x0, mine + offG + (uint64_t)p * C + x0, x1 - x0);
    }
    gridBarrier(flag, passed);
  }
  if (proxyThread) chans[t].flush();
  bumpFlags(a, flag);
}
