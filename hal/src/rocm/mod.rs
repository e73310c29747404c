//! The ROCm backend: HIP resolved at run time (libloading), hip-sys for opaque types.
//!
//! The binary starts without ROCm: the first call loads `libamdhip64.so` (`.so.7`, `.so.6`,
//! `.so.5`) and returns [`crate::Error::NoDriver`] listing every name tried when none loads.
//! IPC goes through the AMD IPC handle cache. Multicast (NVLS) is never supported here.

mod conv;
mod device;
mod graph;
mod ipc;
mod memory;
mod module;
mod stream;

pub use device::RocmDevice;
pub use graph::RocmGraph;
pub use ipc::HipOpener;
pub use ipc::RocmImported;
pub use memory::{RocmHostRegistration, RocmMemory};
pub use module::{RocmKernel, RocmModule};
pub use stream::{RocmEvent, RocmStream};

use crate::{
    check_range, deferred, Api, Buffer, DeviceProperties, IpcDescriptor, IpcKind, LaunchConfig,
    MemoryKind, Result,
};
use conv::{check, hip};
use std::time::Duration;

/// The ROCm backend type (`mscclpp_hal::api::Rocm`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rocm;

impl Api for Rocm {
    const NAME: &'static str = "rocm";
    const HOST_ADDRESSABLE: bool = false;
    type Device = RocmDevice;
    type Memory = RocmMemory;
    type Imported = RocmImported;
    type Stream = RocmStream;
    type Event = RocmEvent;
    type Module = RocmModule;
    type Kernel = RocmKernel;
    type HostRegistration = RocmHostRegistration;

    fn device_count() -> Result<usize> {
        deferred::check()?;
        device::count()
    }
    fn open_device(ordinal: usize) -> Result<RocmDevice> {
        deferred::check()?;
        device::open(ordinal)
    }
    fn device_ordinal(dev: &RocmDevice) -> usize {
        dev.ordinal as usize
    }
    fn set_current(dev: &RocmDevice) -> Result<()> {
        deferred::check()?;
        dev.bind()
    }
    fn current_ordinal() -> Result<Option<usize>> {
        deferred::check()?;
        device::current_ordinal()
    }
    fn properties(dev: &RocmDevice) -> Result<DeviceProperties> {
        deferred::check()?;
        device::properties(dev)
    }
    fn can_access_peer(dev: &RocmDevice, peer: &RocmDevice) -> Result<bool> {
        deferred::check()?;
        device::can_access_peer(dev, peer)
    }
    fn enable_peer_access(dev: &RocmDevice, peer: &RocmDevice) -> Result<()> {
        deferred::check()?;
        device::enable_peer_access(dev, peer)
    }
    fn multicast_supported(_dev: &RocmDevice) -> Result<bool> {
        Ok(false)
    }
    fn synchronize(dev: &RocmDevice, timeout: Duration) -> Result<()> {
        deferred::check()?;
        stream::device_synchronize(dev, timeout)
    }

    fn alloc(dev: &RocmDevice, size: usize, kind: MemoryKind) -> Result<RocmMemory> {
        deferred::check()?;
        memory::alloc(dev, size, kind)
    }
    fn memset(
        dev: &RocmDevice,
        dst: &impl Buffer,
        offset: usize,
        value: u8,
        len: usize,
    ) -> Result<()> {
        deferred::check()?;
        memory::memset(dev, dst, offset, value, len)
    }
    fn write(dev: &RocmDevice, dst: &impl Buffer, offset: usize, src: &[u8]) -> Result<()> {
        deferred::check()?;
        check_range("write(rocm)", dst.size(), offset, src.len())?;
        memory::memcpy(
            dev,
            "hipMemcpy(HtoD)",
            dst.device_ptr() + offset as u64,
            src.as_ptr() as usize as u64,
            src.len(),
        )
    }
    fn read(dev: &RocmDevice, src: &impl Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        deferred::check()?;
        check_range("read(rocm)", src.size(), offset, dst.len())?;
        memory::memcpy(
            dev,
            "hipMemcpy(DtoH)",
            dst.as_mut_ptr() as usize as u64,
            src.device_ptr() + offset as u64,
            dst.len(),
        )
    }
    fn copy(
        dev: &RocmDevice,
        dst: &impl Buffer,
        dst_offset: usize,
        src: &impl Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        deferred::check()?;
        check_range("copy(rocm) dst", dst.size(), dst_offset, len)?;
        check_range("copy(rocm) src", src.size(), src_offset, len)?;
        memory::memcpy(
            dev,
            "hipMemcpy(DtoD)",
            dst.device_ptr() + dst_offset as u64,
            src.device_ptr() + src_offset as u64,
            len,
        )
    }
    unsafe fn memset_async(stream: &RocmStream, dst: u64, value: u8, len: usize) -> Result<()> {
        deferred::check()?;
        let h = hip()?;
        stream.dev.bind()?;
        // SAFETY: the caller keeps the range alive until the stream is done.
        check("hipMemsetAsync", unsafe {
            (h.hipMemsetAsync)(
                dst as usize as *mut std::ffi::c_void,
                i32::from(value),
                len,
                stream.raw,
            )
        })
    }
    unsafe fn memcpy_async(stream: &RocmStream, dst: u64, src: u64, len: usize) -> Result<()> {
        deferred::check()?;
        let h = hip()?;
        stream.dev.bind()?;
        // SAFETY: the caller keeps both ranges alive until the stream is done.
        check("hipMemcpyAsync", unsafe {
            (h.hipMemcpyAsync)(
                dst as usize as *mut std::ffi::c_void,
                src as usize as *const std::ffi::c_void,
                len,
                conv::HIP_MEMCPY_DEFAULT,
                stream.raw,
            )
        })
    }

    unsafe fn write_value64_async(stream: &RocmStream, dst: u64, value: u64) -> Result<()> {
        deferred::check()?;
        let h = hip()?;
        stream.dev.bind()?;
        // SAFETY: the caller keeps the aligned target alive until the stream is done.
        check("hipStreamWriteValue64", unsafe {
            (h.hipStreamWriteValue64)(stream.raw, dst as usize as *mut std::ffi::c_void, value, 0)
        })
    }

    unsafe fn register_host(
        dev: &RocmDevice,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RocmHostRegistration> {
        deferred::check()?;
        // SAFETY: forwarded from the caller.
        unsafe { memory::register_host(dev, ptr, len) }
    }
    fn host_registration_device_ptr(r: &RocmHostRegistration) -> u64 {
        r.device_ptr()
    }

    fn create_stream(dev: &RocmDevice) -> Result<RocmStream> {
        deferred::check()?;
        stream::create_stream(dev)
    }
    fn stream_synchronize(s: &RocmStream, timeout: Duration) -> Result<()> {
        deferred::check()?;
        stream::stream_synchronize(s, timeout)
    }
    fn create_event(dev: &RocmDevice) -> Result<RocmEvent> {
        deferred::check()?;
        stream::create_event(dev)
    }
    fn record_event(event: &RocmEvent, s: &RocmStream) -> Result<()> {
        deferred::check()?;
        stream::record(event, s)
    }
    fn event_synchronize(event: &RocmEvent, timeout: Duration) -> Result<()> {
        deferred::check()?;
        stream::event_synchronize(event, timeout)
    }
    fn event_elapsed_ms(start: &RocmEvent, end: &RocmEvent) -> Result<f32> {
        deferred::check()?;
        stream::elapsed_ms(start, end)
    }

    fn load_module(dev: &RocmDevice, code: &[u8]) -> Result<RocmModule> {
        deferred::check()?;
        module::load(dev, code)
    }
    fn get_kernel(m: &RocmModule, name: &str) -> Result<RocmKernel> {
        deferred::check()?;
        module::get_kernel(m, name)
    }
    unsafe fn launch_raw(
        kernel: &RocmKernel,
        cfg: &LaunchConfig,
        s: &RocmStream,
        args: &[u8],
    ) -> Result<()> {
        deferred::check()?;
        // SAFETY: forwarded from the caller.
        unsafe { module::launch(kernel, cfg, s, args) }
    }

    fn ipc_kinds(mem: &RocmMemory) -> Vec<IpcKind> {
        if mem.host.is_some() {
            Vec::new()
        } else {
            vec![IpcKind::Legacy]
        }
    }
    fn export(mem: &RocmMemory, kind: IpcKind) -> Result<IpcDescriptor> {
        deferred::check()?;
        ipc::export(mem, kind)
    }
    fn import(dev: &RocmDevice, desc: &IpcDescriptor) -> Result<RocmImported> {
        deferred::check()?;
        ipc::import(dev, desc)
    }
}
