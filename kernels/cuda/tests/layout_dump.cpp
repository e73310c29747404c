// Prints the size, alignment and field offsets of every device-handle struct, as the host C++
// compiler lays them out, so a Rust test can compare them with its #[repr(C)] mirrors.
// Build: g++ -std=c++17 -I kernels/cuda/include kernels/cuda/tests/layout_dump.cpp -o layout_dump
// Output lines:  "Name size N", "Name align N", "Name.field offset N", and two encoded example
// triggers ("trigger_example NAME fst 0x... snd 0x...") to check the bit packing.
#include <cstddef>
#include <cstdio>
#include <mscclpp/device_api.hpp>

using namespace mscclpp;

#define SIZE(T) std::printf("%s size %zu\n%s align %zu\n", #T, sizeof(T), #T, alignof(T))
#define SIZE_ONLY(T) std::printf("%s size %zu\n", #T, sizeof(T))
#define FIELD(T, f) std::printf("%s.%s offset %zu\n", #T, #f, offsetof(T, f))

int main() {
  SIZE(ProxyTrigger);
  FIELD(ProxyTrigger, fst);
  FIELD(ProxyTrigger, snd);

  SIZE(FifoDeviceHandle);
  FIELD(FifoDeviceHandle, triggers);
  FIELD(FifoDeviceHandle, head);
  FIELD(FifoDeviceHandle, tail);
  FIELD(FifoDeviceHandle, tailCache);
  FIELD(FifoDeviceHandle, size);
  FIELD(FifoDeviceHandle, pad);

  SIZE(Host2DeviceSemaphoreDeviceHandle);
  FIELD(Host2DeviceSemaphoreDeviceHandle, inboundToken);
  FIELD(Host2DeviceSemaphoreDeviceHandle, expectedInboundToken);

  SIZE(MemoryDevice2DeviceSemaphoreDeviceHandle);
  FIELD(MemoryDevice2DeviceSemaphoreDeviceHandle, inboundToken);
  FIELD(MemoryDevice2DeviceSemaphoreDeviceHandle, remoteInboundToken);
  FIELD(MemoryDevice2DeviceSemaphoreDeviceHandle, expectedInboundToken);

  SIZE(BaseMemoryChannelDeviceHandle);
  FIELD(BaseMemoryChannelDeviceHandle, semaphore);

  SIZE(MemoryChannelDeviceHandle);
  FIELD(MemoryChannelDeviceHandle, semaphore);
  FIELD(MemoryChannelDeviceHandle, dst);
  FIELD(MemoryChannelDeviceHandle, src);
  FIELD(MemoryChannelDeviceHandle, packetBuffer);

  SIZE(BasePortChannelDeviceHandle);
  FIELD(BasePortChannelDeviceHandle, semaphoreId);
  FIELD(BasePortChannelDeviceHandle, pad);
  FIELD(BasePortChannelDeviceHandle, semaphore);
  FIELD(BasePortChannelDeviceHandle, fifo);

  SIZE(PortChannelDeviceHandle);
  FIELD(PortChannelDeviceHandle, base);
  FIELD(PortChannelDeviceHandle, dst);
  FIELD(PortChannelDeviceHandle, src);

  SIZE(LL16Packet);
  FIELD(LL16Packet, data1);
  FIELD(LL16Packet, flag1);
  FIELD(LL16Packet, data2);
  FIELD(LL16Packet, flag2);

  SIZE(SwitchChannelDeviceHandle);
  FIELD(SwitchChannelDeviceHandle, devicePtr);
  FIELD(SwitchChannelDeviceHandle, mcPtr);
  FIELD(SwitchChannelDeviceHandle, bufferSize);

  SIZE_ONLY(f32x4);
  SIZE_ONLY(f16x8);
  SIZE_ONLY(bf16x8);

  SIZE(LL8Packet);
  FIELD(LL8Packet, data);
  FIELD(LL8Packet, flag);

  // makeProxyTrigger(type, dstMemoryId, dstOffset, srcMemoryId, srcOffset, size, semaphoreId)
  const ProxyTrigger a = makeProxyTrigger(TriggerData | TriggerFlag, 5, 0x1000, 3, 0x2000, 0x400, 7);
  std::printf("trigger_example data_flag fst 0x%016llx snd 0x%016llx\n", (unsigned long long)a.fst,
              (unsigned long long)a.snd);
  const ProxyTrigger b = makeProxyTrigger(TriggerSync, MaxMemoryId, 0xffffffffull, MaxMemoryId, 0xffffffffull,
                                          0xffffffffull, MaxSemaphoreId);
  std::printf("trigger_example all_ones fst 0x%016llx snd 0x%016llx\n", (unsigned long long)b.fst,
              (unsigned long long)b.snd);
  std::printf("trigger_parity pos 0 size 8 bit %d pos 8 size 8 bit %d pos 17 size 8 bit %d\n",
              triggerParityBit(0, 8) ? 1 : 0, triggerParityBit(8, 8) ? 1 : 0, triggerParityBit(17, 8) ? 1 : 0);
  return 0;
}
