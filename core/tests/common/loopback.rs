//! Connections and a host proxy inside one process, for the single-process connection tests.
#![allow(dead_code)] // each test file uses a different subset

use mscclpp::port_channel::{BasePortChannelDeviceHandle, MemoryId};
use mscclpp::semaphore::{Host2DeviceSemaphore, Semaphore};
use mscclpp::{Connection, Context, Device, Endpoint, LocalMemory, ProxyService, Transport};

/// Two connections between two fresh endpoints of `t` in this process (a -> b and b -> a).
pub fn pair(ctx: &Context, t: Transport) -> (Connection, Connection) {
    let a = ctx.create_endpoint(t.into()).unwrap();
    let b = ctx.create_endpoint(t.into()).unwrap();
    let (a_wire, b_wire) = (a.serialize(), b.serialize());
    let ctx2 = ctx.clone();
    let b2 = b.clone();
    let h = std::thread::spawn(move || {
        let remote_a = Endpoint::deserialize(&a_wire).unwrap();
        ctx2.connect(&b2, &remote_a).unwrap()
    });
    let remote_b = Endpoint::deserialize(&b_wire).unwrap();
    let ab = ctx.connect(&a, &remote_b).unwrap();
    (ab, h.join().unwrap())
}

/// A started host proxy holding `sem` and 64 bytes of CPU memory registered for CudaIpc:
/// returns it with its channel's device handle, the memory's id and the memory.
pub fn started_proxy(
    ctx: &Context,
    sem: Semaphore,
) -> (
    ProxyService,
    BasePortChannelDeviceHandle,
    MemoryId,
    LocalMemory,
) {
    let mem = LocalMemory::alloc(Device::CPU, 64).unwrap();
    let reg = ctx
        .register_buffer(&mem, Transport::CudaIpc.into())
        .unwrap();
    let mut proxy = ProxyService::new_host().unwrap();
    let id = proxy
        .add_semaphore(Host2DeviceSemaphore::new(sem).unwrap())
        .unwrap();
    let m = proxy.add_memory(reg).unwrap();
    let ch = proxy.base_port_channel(id).unwrap().device_handle();
    proxy.start_proxy().unwrap();
    (proxy, ch, m, mem)
}
