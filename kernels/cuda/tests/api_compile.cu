// Instantiates every device API entry point once, so check.sh catches template errors in code the
// test kernels do not use. Compiled by kernels/check.sh only (not embedded in the library).
#include <mscclpp/device_api.hpp>

using namespace mscclpp;

#if defined(MSCCLPP_DEVICE_CUDA)
// Switch channel (multimem) ops, every vector type once; on sm_80 they compile to a trap.
extern "C" __global__ void api_compile_switch(SwitchChannelDeviceHandle sc, uint32_t* out, uint64_t n) {
  const uint32_t t = threadIdx.x, nt = blockDim.x;
  const f32x4 a = sc.reduce<f32x4>(0);
  sc.broadcast<f32x4>(1, a);
  sc.broadcast(2, sc.reduce<f16x8>(2));
  sc.broadcast(3, sc.reduce<bf16x8>(3));
  sc.broadcast(4, multimemLoadReduce(reinterpret_cast<const f32x2*>(sc.mcPtr) + 8));
  sc.broadcast(5, sc.reduce<f32x1>(20));
  sc.broadcast(6, sc.reduce<f16x4>(12));
  sc.broadcast(7, sc.reduce<f16x2>(28));
  sc.broadcast(8, sc.reduce<bf16x4>(14));
  sc.broadcast(9, sc.reduce<bf16x2>(30));
  sc.broadcast(10, sc.reduce<i32x1>(40));
  sc.broadcast(11, sc.reduce<u32x1>(41));
  sc.allReduce<f32x4>(16, n, t, nt);
  out[0] = a.words[0];
}
#endif

extern "C" __global__ void api_compile(MemoryChannelDeviceHandle mc, BaseMemoryChannelDeviceHandle bmc,
                                       PortChannelDeviceHandle pc, BasePortChannelDeviceHandle bpc,
                                       Host2DeviceSemaphoreDeviceHandle h2d, FifoDeviceHandle fifo, uint32_t* out,
                                       void* a, void* b, uint64_t n) {
  const uint32_t t = threadIdx.x, nt = blockDim.x;
  copy(a, b, n, t, nt);
  copyToPackets<LL8Packet>(a, b, n, t, nt, 1);
  copyFromPackets<LL8Packet>(b, a, n, t, nt, 1, 100);
  copyToPackets<LL16Packet>(a, b, n, t, nt, 1);
  copyFromPackets<LL16Packet>(b, a, n, t, nt, 1);
  mc.put(0, 4, n, t, nt);
  mc.put(8, n, t, nt);
  mc.get(4, 0, n, t, nt);
  mc.get(8, n, t, nt);
  mc.putPackets<LL8Packet>(0, 0, n, t, nt, 2);
  mc.putPackets(0, 0, n, t, nt, 2);
  mc.unpackPackets<LL8Packet>(0, 0, n, t, nt, 2);
  mc.unpackPackets(0, 0, n, t, nt, 2, 1000);
  uint2 p16 = mc.unpackPacket(0, 3);
  uint32_t p8 = mc.unpackPacket<LL8Packet>(1, 3, 10);
  out[0] = mc.read<uint32_t>(0) + p16.x + p16.y + p8;
  mc.write<uint64_t>(1, 42ull);
  mc.signal();
  mc.relaxedSignal();
  mc.wait();
  mc.relaxedWait(10);
  out[1] = mc.poll();
  bmc.signal();
  bmc.relaxedSignal();
  bmc.wait(5);
  bmc.relaxedWait();
  out[2] = bmc.poll();
  pc.put(0, 0, 64);
  pc.put(0, 64);
  pc.signal();
  pc.putWithSignal(0, 0, 64);
  pc.putWithSignal(0, 64);
  pc.putWithSignalAndFlush(0, 0, 64, 1000);
  pc.putWithSignalAndFlush(0, 64);
  pc.flush();
  pc.wait();
  out[3] = pc.poll();
  bpc.put(1, 0, 2, 0, 64);
  bpc.put(1, 2, 0, 64);
  bpc.putWithSignal(1, 0, 2, 0, 64);
  bpc.putWithSignalAndFlush(1, 0, 2, 0, 64);
  bpc.signal();
  bpc.flush(100);
  bpc.wait(100);
  out[4] = bpc.poll();
  h2d.wait();
  h2d.relaxedWait(7);
  out[5] = h2d.poll();
  const uint64_t pos = fifo.push(makeProxyTrigger(TriggerData, 1, 2, 3, 4, 5, 6), 100);
  fifo.sync(pos, 100);
}
