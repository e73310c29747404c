//! The host backend: one "device" (the CPU), memory in shared memfd mappings.
//!
//! A device pointer is the host virtual address of the mapping. Copies are `memcpy`, streams
//! complete every operation before returning, events record wall-clock instants, and kernel
//! launch is [`Error::Unsupported`]. Memory is `MAP_SHARED` over a memfd, so another process
//! that imports it (fd passed over [`crate::fdpass`]) sees the same physical pages and atomics
//! work across processes.

mod device;
mod graph;
mod ipc;
mod memory;
mod module;
mod stream;

pub use device::HostDevice;
pub use graph::HostGraph;
pub use ipc::HostImported;
pub use memory::{HostMemory, HostRegistration};
pub use module::{HostKernel, HostModule};
pub use stream::{HostEvent, HostStream};

use crate::{
    deferred, Api, Buffer, DeviceProperties, IpcDescriptor, IpcKind, LaunchConfig, MemoryKind,
    Result,
};
use std::time::Duration;

/// The host backend type (`mscclpp_hal::api::Host`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Host;

impl Api for Host {
    const NAME: &'static str = "host";
    const HOST_ADDRESSABLE: bool = true;
    type Device = HostDevice;
    type Memory = HostMemory;
    type Imported = HostImported;
    type Stream = HostStream;
    type Event = HostEvent;
    type Module = HostModule;
    type Kernel = HostKernel;
    type HostRegistration = HostRegistration;

    fn device_count() -> Result<usize> {
        deferred::check()?;
        Ok(1)
    }
    fn open_device(ordinal: usize) -> Result<HostDevice> {
        deferred::check()?;
        device::open(ordinal)
    }
    fn device_ordinal(_dev: &HostDevice) -> usize {
        0
    }
    fn set_current(_dev: &HostDevice) -> Result<()> {
        deferred::check()
    }
    fn current_ordinal() -> Result<Option<usize>> {
        deferred::check()?;
        Ok(Some(0))
    }
    fn properties(_dev: &HostDevice) -> Result<DeviceProperties> {
        deferred::check()?;
        Ok(device::properties())
    }
    fn can_access_peer(_dev: &HostDevice, _peer: &HostDevice) -> Result<bool> {
        Ok(true)
    }
    fn enable_peer_access(_dev: &HostDevice, _peer: &HostDevice) -> Result<()> {
        deferred::check()
    }
    fn multicast_supported(_dev: &HostDevice) -> Result<bool> {
        Ok(false)
    }
    fn synchronize(_dev: &HostDevice, _timeout: Duration) -> Result<()> {
        deferred::check()
    }

    fn alloc(_dev: &HostDevice, size: usize, kind: MemoryKind) -> Result<HostMemory> {
        deferred::check()?;
        memory::alloc(size, kind)
    }
    fn memset(
        _dev: &HostDevice,
        dst: &impl Buffer,
        offset: usize,
        value: u8,
        len: usize,
    ) -> Result<()> {
        deferred::check()?;
        memory::memset(dst, offset, value, len)
    }
    fn write(_dev: &HostDevice, dst: &impl Buffer, offset: usize, src: &[u8]) -> Result<()> {
        deferred::check()?;
        memory::write(dst, offset, src)
    }
    fn read(_dev: &HostDevice, src: &impl Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        deferred::check()?;
        memory::read(src, offset, dst)
    }
    fn copy(
        _dev: &HostDevice,
        dst: &impl Buffer,
        dst_offset: usize,
        src: &impl Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        deferred::check()?;
        memory::copy(dst, dst_offset, src, src_offset, len)
    }
    unsafe fn memset_async(_stream: &HostStream, dst: u64, value: u8, len: usize) -> Result<()> {
        deferred::check()?;
        // SAFETY: the caller guarantees dst..dst+len is live memory (host addresses here).
        unsafe { std::ptr::write_bytes(dst as usize as *mut u8, value, len) };
        Ok(())
    }
    unsafe fn memcpy_async(_stream: &HostStream, dst: u64, src: u64, len: usize) -> Result<()> {
        deferred::check()?;
        // SAFETY: the caller guarantees both ranges are live and do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src as usize as *const u8, dst as usize as *mut u8, len)
        };
        Ok(())
    }

    unsafe fn write_value64_async(_stream: &HostStream, dst: u64, value: u64) -> Result<()> {
        deferred::check()?;
        // SAFETY: the caller guarantees an aligned, live u64 that others access atomically.
        let atom = unsafe { std::sync::atomic::AtomicU64::from_ptr(dst as usize as *mut u64) };
        atom.store(value, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    unsafe fn register_host(
        _dev: &HostDevice,
        ptr: *mut u8,
        len: usize,
    ) -> Result<HostRegistration> {
        deferred::check()?;
        memory::register_host(ptr, len)
    }
    fn host_registration_device_ptr(r: &HostRegistration) -> u64 {
        r.device_ptr()
    }

    fn create_stream(_dev: &HostDevice) -> Result<HostStream> {
        deferred::check()?;
        Ok(HostStream)
    }
    fn stream_synchronize(_stream: &HostStream, _timeout: Duration) -> Result<()> {
        deferred::check()
    }
    fn create_event(_dev: &HostDevice) -> Result<HostEvent> {
        deferred::check()?;
        Ok(HostEvent::default())
    }
    fn record_event(event: &HostEvent, _stream: &HostStream) -> Result<()> {
        deferred::check()?;
        event.record();
        Ok(())
    }
    fn event_synchronize(_event: &HostEvent, _timeout: Duration) -> Result<()> {
        deferred::check()
    }
    fn event_elapsed_ms(start: &HostEvent, end: &HostEvent) -> Result<f32> {
        deferred::check()?;
        stream::elapsed_ms(start, end)
    }

    fn load_module(_dev: &HostDevice, _code: &[u8]) -> Result<HostModule> {
        module::unsupported("load_module")
    }
    fn get_kernel(_module: &HostModule, _name: &str) -> Result<HostKernel> {
        module::unsupported("get_kernel")
    }
    unsafe fn launch_raw(
        _kernel: &HostKernel,
        _cfg: &LaunchConfig,
        _stream: &HostStream,
        _args: &[u8],
    ) -> Result<()> {
        module::unsupported("launch")
    }

    fn ipc_kinds(_mem: &HostMemory) -> Vec<IpcKind> {
        vec![IpcKind::HostMemfd]
    }
    fn export(mem: &HostMemory, kind: IpcKind) -> Result<IpcDescriptor> {
        deferred::check()?;
        ipc::export(mem, kind)
    }
    fn import(_dev: &HostDevice, desc: &IpcDescriptor) -> Result<HostImported> {
        deferred::check()?;
        ipc::import(desc)
    }
}
