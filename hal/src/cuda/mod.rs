//! The CUDA backend: cudarc's driver bindings with dynamic loading.
//!
//! The binary starts without libcuda: the first call checks that the library is present and
//! returns [`crate::Error::NoDriver`] (listing every name tried) when it is not. Memory comes from
//! cuMemAlloc / cuMemHostAlloc / cuMem VMM (never the stream-ordered pool, which peers cannot
//! touch). Never creates multicast objects.

mod conv;
mod device;
mod graph;
mod ipc;
mod memory;
mod module;
mod stream;

pub use device::CudaDevice;
pub use graph::CudaGraph;
pub use ipc::CudaImported;
pub use memory::{CudaHostRegistration, CudaMemory};
pub use module::{CudaKernel, CudaModule};
pub use stream::{CudaEvent, CudaStream};

use crate::{
    deferred, Api, Buffer, DeviceProperties, IpcDescriptor, IpcKind, LaunchConfig, MemoryKind,
    Result,
};
use conv::check;
use cudarc::driver::sys;
use std::time::Duration;

/// The CUDA backend type (`mscclpp_hal::api::Cuda`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cuda;

impl Api for Cuda {
    const NAME: &'static str = "cuda";
    const HOST_ADDRESSABLE: bool = false;
    type Device = CudaDevice;
    type Memory = CudaMemory;
    type Imported = CudaImported;
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Module = CudaModule;
    type Kernel = CudaKernel;
    type HostRegistration = CudaHostRegistration;

    fn device_count() -> Result<usize> {
        deferred::check()?;
        device::count()
    }
    fn open_device(ordinal: usize) -> Result<CudaDevice> {
        deferred::check()?;
        device::open(ordinal)
    }
    fn device_ordinal(dev: &CudaDevice) -> usize {
        dev.ordinal()
    }
    fn set_current(dev: &CudaDevice) -> Result<()> {
        deferred::check()?;
        dev.bind()
    }
    fn current_ordinal() -> Result<Option<usize>> {
        deferred::check()?;
        device::current_ordinal()
    }
    fn properties(dev: &CudaDevice) -> Result<DeviceProperties> {
        deferred::check()?;
        device::properties(dev)
    }
    fn can_access_peer(dev: &CudaDevice, peer: &CudaDevice) -> Result<bool> {
        deferred::check()?;
        device::can_access_peer(dev, peer)
    }
    fn enable_peer_access(dev: &CudaDevice, peer: &CudaDevice) -> Result<()> {
        deferred::check()?;
        device::enable_peer_access(dev, peer)
    }
    fn multicast_supported(dev: &CudaDevice) -> Result<bool> {
        deferred::check()?;
        let v = dev
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
                "cuDeviceGetAttribute(MULTICAST_SUPPORTED)",
            )
            .unwrap_or(0);
        Ok(v != 0)
    }
    fn synchronize(dev: &CudaDevice, timeout: Duration) -> Result<()> {
        deferred::check()?;
        device::synchronize(dev, timeout)
    }

    fn alloc(dev: &CudaDevice, size: usize, kind: MemoryKind) -> Result<CudaMemory> {
        deferred::check()?;
        memory::alloc(dev, size, kind)
    }
    fn memset(
        dev: &CudaDevice,
        dst: &impl Buffer,
        offset: usize,
        value: u8,
        len: usize,
    ) -> Result<()> {
        deferred::check()?;
        memory::memset(dev, dst, offset, value, len)
    }
    fn write(dev: &CudaDevice, dst: &impl Buffer, offset: usize, src: &[u8]) -> Result<()> {
        deferred::check()?;
        memory::write(dev, dst, offset, src)
    }
    fn read(dev: &CudaDevice, src: &impl Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        deferred::check()?;
        memory::read(dev, src, offset, dst)
    }
    fn copy(
        dev: &CudaDevice,
        dst: &impl Buffer,
        dst_offset: usize,
        src: &impl Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        deferred::check()?;
        memory::copy(dev, dst, dst_offset, src, src_offset, len)
    }
    unsafe fn memset_async(stream: &CudaStream, dst: u64, value: u8, len: usize) -> Result<()> {
        deferred::check()?;
        stream.dev.bind()?;
        // SAFETY: the caller keeps the range alive until the stream is done.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(dst, value, len, stream.raw)
        })
    }
    unsafe fn memcpy_async(stream: &CudaStream, dst: u64, src: u64, len: usize) -> Result<()> {
        deferred::check()?;
        stream.dev.bind()?;
        // SAFETY: the caller keeps both ranges alive until the stream is done.
        check("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(dst, src, len, stream.raw)
        })
    }

    unsafe fn write_value64_async(stream: &CudaStream, dst: u64, value: u64) -> Result<()> {
        deferred::check()?;
        stream.dev.bind()?;
        // SAFETY: the caller keeps the aligned target alive until the stream is done.
        // Flags 0 = CU_STREAM_WRITE_VALUE_DEFAULT: prior writes are flushed before the store.
        // https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEMOP.html
        check("cuStreamWriteValue64", unsafe {
            sys::cuStreamWriteValue64_v2(stream.raw, dst, value, 0)
        })
    }

    unsafe fn register_host(
        dev: &CudaDevice,
        ptr: *mut u8,
        len: usize,
    ) -> Result<CudaHostRegistration> {
        deferred::check()?;
        // SAFETY: forwarded from the caller.
        unsafe { memory::register_host(dev, ptr, len) }
    }
    fn host_registration_device_ptr(r: &CudaHostRegistration) -> u64 {
        r.device_ptr()
    }

    fn create_stream(dev: &CudaDevice) -> Result<CudaStream> {
        deferred::check()?;
        stream::create_stream(dev)
    }
    fn stream_synchronize(s: &CudaStream, timeout: Duration) -> Result<()> {
        deferred::check()?;
        stream::stream_synchronize(s, timeout)
    }
    fn create_event(dev: &CudaDevice) -> Result<CudaEvent> {
        deferred::check()?;
        stream::create_event(dev)
    }
    fn record_event(event: &CudaEvent, s: &CudaStream) -> Result<()> {
        deferred::check()?;
        stream::record(event, s)
    }
    fn event_synchronize(event: &CudaEvent, timeout: Duration) -> Result<()> {
        deferred::check()?;
        stream::event_synchronize(event, timeout)
    }
    fn event_elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        deferred::check()?;
        stream::elapsed_ms(start, end)
    }

    fn load_module(dev: &CudaDevice, code: &[u8]) -> Result<CudaModule> {
        deferred::check()?;
        module::load(dev, code)
    }
    fn get_kernel(m: &CudaModule, name: &str) -> Result<CudaKernel> {
        deferred::check()?;
        module::get_kernel(m, name)
    }
    unsafe fn launch_raw(
        kernel: &CudaKernel,
        cfg: &LaunchConfig,
        s: &CudaStream,
        args: &[u8],
    ) -> Result<()> {
        deferred::check()?;
        // SAFETY: forwarded from the caller.
        unsafe { module::launch(kernel, cfg, s, args) }
    }

    fn ipc_kinds(mem: &CudaMemory) -> Vec<IpcKind> {
        ipc::kinds(mem)
    }
    fn export(mem: &CudaMemory, kind: IpcKind) -> Result<IpcDescriptor> {
        deferred::check()?;
        ipc::export(mem, kind)
    }
    fn import(dev: &CudaDevice, desc: &IpcDescriptor) -> Result<CudaImported> {
        deferred::check()?;
        ipc::import(dev, desc)
    }
}
