// No unwrap() a peer, a file or the environment could make panic (tests may).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]
//! Hardware abstraction for mscclpp-rs: host, CUDA and ROCm backends, GPU IPC, run-time
//! libibverbs and GDRCopy.
//!
//! # What this layer promises
//!
//! The crate root holds only the contract. [`Api`] names a backend, its associated types
//! (device, memory, imported memory, stream, event, module, kernel, host registration) and,
//! as supertraits, the behaviour traits over them: [`DeviceApi`] (devices and their
//! properties, peer access), [`MemoryApi`] (memory of four kinds, synchronous memset/memcpy),
//! [`HostRegisterApi`] (mapping caller-owned host memory for device access), [`StreamApi`]
//! (streams, events, memset/memcpy/64-bit stores on a stream), [`ModuleApi`] (loading an
//! embedded code object and launching a kernel with a `#[repr(C)]` argument struct) and
//! [`IpcApi`] (export an allocation as an [`IpcDescriptor`], import it in another process;
//! adopt an allocation the application made itself, found behind a plain pointer) and
//! [`MulticastApi`] (NVLink multicast objects: create, export/import, bind, map; refused before
//! any driver call while the environment disables NVLS).
//! All are associated functions (`A::alloc(&dev, ..)`), dispatched statically.
//!
//! Backends live in one folder each with the same file names, each behaviour trait
//! implemented in its file (`device.rs`, `memory.rs`, `stream.rs`, `module.rs`, `ipc.rs`;
//! `mod.rs` holds only the [`Api`] impl; GPU backends add `result.rs`, thin checked wrappers
//! over the driver, and `conv.rs`): [`api::Host`] (always built; memory is a memfd mapping and
//! the "device pointer" is its host address), `api::Cuda` (feature `cuda`, cudarc's driver
//! bindings with dynamic loading) and `api::Rocm` (feature `rocm`, HIP resolved at run
//! time). The vendor is fixed per build: [`Gpu`] names the GPU backend, and core code writes
//! `A: Api` or `Gpu`/`Host`, never `cfg(feature = ...)`. Helpers that are not part of the
//! contract (system calls, fd passing, NUMA, back-off) live in [`auxil`].
//!
//! # What it leaves to the caller
//!
//! Ordering between host and device work beyond what a stream gives, lifetimes of memory used
//! by in-flight asynchronous work (those calls are `unsafe`), and choosing which IPC kind to use
//! when an allocation offers several ([`IpcApi::ipc_kinds`] lists them, preferred first).
//!
//! Failures inside `Drop` (a free, an unmap) cannot be returned; they are logged (warning),
//! recorded and surfaced as [`Error::Deferred`] by the next `device_count` or `open_device`,
//! and [`take_deferred_errors`] takes them all. Other calls never return them: in a process
//! where several threads use the HAL, one thread's failed free must not fail another thread's
//! copy (a proxy's or a network receiver's; a lost signal would stall a kernel).

#[macro_use]
mod macros;

pub mod abort;
pub mod auxil;
pub mod dmabuf;
pub mod env;
mod error;

pub mod gdr;
pub mod graph;
pub mod ibv;
pub mod ipc;
pub mod ipc_cache;
mod multicast;
mod nvls;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by cuda/rtc.rs; tested on every build
mod rtc_cache;

#[cfg(hal_cuda)]
pub mod cuda;
pub mod host;
#[cfg(hal_rocm)]
pub mod rocm;

pub use auxil::deferred::take_deferred_errors;
pub use dmabuf::{DmaBuf, DmaBufApi};
pub use env::parse_nvls_switches;
pub use error::{Error, Result};
pub use graph::StreamInterop;
pub use ipc::{AllocationIdentity, IpcDescriptor, IpcKind};
pub use multicast::{
    multicast_counts, MulticastApi, MulticastCounts, MulticastGranularity, MulticastInfo,
    NvlsPermit,
};
pub use nvls::{nvls_disabled_by_env, nvls_supported};

use std::time::Duration;

/// The NUL-terminated name a driver wrote into `buf` (lossy UTF-8; all of `buf` without a NUL).
#[cfg(any(hal_cuda, hal_rocm))]
pub(crate) fn c_string(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Function `name` (NUL-terminated) of `lib` as `T`, or `None` when the library does not
/// export it (optional entry points of libibverbs, mlx5dv, GDRCopy).
///
/// # Safety
/// `T` is the function pointer type of the symbol's C prototype.
pub(crate) unsafe fn optional_symbol<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Option<T> {
    // SAFETY: forwarded from the caller.
    unsafe { lib.get::<T>(name) }.ok().map(|s| *s)
}

/// [`Error::Unsupported`] for operation `op` of `backend`, with the reason.
pub(crate) fn unsupported<T>(op: &'static str, backend: &'static str, reason: &str) -> Result<T> {
    Err(Error::Unsupported {
        op,
        backend,
        reason: reason.into(),
    })
}

/// The backend types under plain names.
pub mod api {
    #[cfg(hal_cuda)]
    pub use crate::cuda::Cuda;
    pub use crate::host::Host;
    #[cfg(hal_rocm)]
    pub use crate::rocm::Rocm;
}

/// The GPU backend of this build: `Cuda` with feature `cuda`, `Rocm` with `rocm`, else `Host`.
#[cfg(hal_gpu_cuda)]
pub type Gpu = api::Cuda;
/// The GPU backend of this build: `Cuda` with feature `cuda`, `Rocm` with `rocm`, else `Host`.
#[cfg(hal_gpu_rocm)]
pub type Gpu = api::Rocm;
/// The GPU backend of this build: `Cuda` with feature `cuda`, `Rocm` with `rocm`, else `Host`.
#[cfg(hal_gpu_host)]
pub type Gpu = api::Host;

/// What a device reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProperties {
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Streaming multiprocessors (compute units on AMD; logical CPUs on the host backend).
    pub sm_count: u32,
    /// (major, minor); `(0, 0)` on the host backend. On AMD: gfx major/minor.
    pub compute_capability: (u32, u32),
    /// PCI bus id `dddd:bb:dd.f`, empty where there is none (host backend).
    pub pci_bus_id: String,
    /// NUMA node of the device; -1 when unknown (never an error).
    pub numa_node: i32,
}

/// Which memory an allocation is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Plain device memory (`cuMemAlloc`, `hipMalloc`); exports as [`IpcKind::Legacy`].
    Device,
    /// Pinned host memory mapped for the device; `host_ptr()` is `Some`.
    HostMapped,
    /// AMD fine-grained (uncached) device memory; elsewhere the same as `Device`.
    Uncached,
    /// Physical allocation mapped into a reserved range (cuMem/VMM); the size is rounded up to
    /// a multiple of `granularity` (0 = the device's minimum). Exports as
    /// [`IpcKind::PosixFd`] (and [`IpcKind::Fabric`] where supported).
    Physical {
        /// Allocation granularity in bytes; 0 = the device's minimum.
        granularity: usize,
    },
}

/// Memory visible to a device: an allocation or an imported mapping.
pub trait Buffer: Send + Sync {
    /// The address kernels use (on the host backend: the host address).
    fn device_ptr(&self) -> u64;
    /// Usable bytes (what was asked for, or what the exporter exported).
    fn size(&self) -> usize;
    /// The host address when the host can touch the memory directly.
    fn host_ptr(&self) -> Option<*mut u8>;
}

/// Grid, block and dynamic shared memory of a kernel launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// A backend: its name, its associated types, and (as supertraits) every behaviour the core
/// needs. Callers write `A: Api` and call `A::alloc(..)`; code that names a concrete backend
/// (`Gpu::alloc`) imports the behaviour traits with `use mscclpp_hal::prelude::*`.
///
/// The behaviour traits name the types as `<Self as Api>::Device` with a `where Self: Api` on
/// each function: the types stay here (so `<Gpu as Api>::Device` keeps working) without a
/// supertrait cycle.
pub trait Api:
    DeviceApi
    + MemoryApi
    + HostRegisterApi
    + StreamApi
    + ModuleApi
    + IpcApi
    + MulticastApi
    + DmaBufApi
    + Sized
    + Send
    + Sync
    + 'static
{
    /// Backend name (`host`, `cuda`, `rocm`).
    const NAME: &'static str;
    /// Whether the host can load and store this backend's device memory directly (true for the
    /// host backend, whose "device pointers" are host addresses; false for GPU backends, whose
    /// device memory is reached only through the driver or a kernel).
    const HOST_ADDRESSABLE: bool;
    /// An opened device (on CUDA: holds the primary context). Cheap to clone.
    type Device: Clone + Send + Sync + std::fmt::Debug;
    /// An allocation that owns its memory; dropping it frees the memory.
    type Memory: Buffer + std::fmt::Debug;
    /// Memory imported from another process; dropping it unmaps it and closes its fd.
    type Imported: Buffer + std::fmt::Debug;
    /// An ordered queue of device work.
    type Stream: Send + Sync + std::fmt::Debug;
    /// A marker recorded on a stream.
    type Event: Send + Sync + std::fmt::Debug;
    /// A loaded code object.
    type Module: Send + Sync + std::fmt::Debug;
    /// A kernel inside a module.
    type Kernel: Clone + Send + Sync + std::fmt::Debug;
    /// Host memory the caller owns, pinned and mapped for device access by
    /// [`HostRegisterApi::register_host`]; dropping it unregisters the range (the memory stays
    /// the caller's and is not freed).
    type HostRegistration: Send + Sync + std::fmt::Debug;
    /// This process's handle of a multicast object (created or imported, see
    /// [`MulticastApi`]); clones share it and the last one releases it.
    type Multicast: Clone + Send + Sync + std::fmt::Debug;
    /// An exported multicast object: its shareable handles, withdrawn when dropped.
    type MulticastExport: Send + Sync + std::fmt::Debug;
    /// Memory bound to a multicast object at an offset; dropping it unbinds.
    type MulticastBinding: Send + Sync + std::fmt::Debug;
    /// A mapping of a multicast object; its device pointer is the multicast address at the
    /// requested offset. Dropping it unmaps the range.
    type MulticastMapping: Buffer + std::fmt::Debug;
}

/// Devices: how many, opening one, its properties, peer access (each backend's `device.rs`).
pub trait DeviceApi {
    /// Number of devices; `Err(NoDriver)` when the driver library is missing.
    fn device_count() -> Result<usize>
    where
        Self: Api;
    /// Opens device `ordinal` and makes it current on the calling thread.
    fn open_device(ordinal: usize) -> Result<<Self as Api>::Device>
    where
        Self: Api;
    /// The ordinal `dev` was opened with.
    fn device_ordinal(dev: &<Self as Api>::Device) -> usize
    where
        Self: Api;
    /// Makes `dev` current on the calling thread (CUDA: sets its context).
    fn set_current(dev: &<Self as Api>::Device) -> Result<()>
    where
        Self: Api;
    /// The ordinal of the calling thread's current device (CUDA: the device of the current
    /// context; HIP: `hipGetDevice`), `None` when the thread has none yet. The host backend
    /// always answers device 0.
    fn current_ordinal() -> Result<Option<usize>>;
    /// Name, SM count, compute capability, PCI bus id, NUMA node.
    fn properties(dev: &<Self as Api>::Device) -> Result<DeviceProperties>
    where
        Self: Api;
    /// Whether `dev` can map memory of `peer` directly.
    fn can_access_peer(dev: &<Self as Api>::Device, peer: &<Self as Api>::Device) -> Result<bool>
    where
        Self: Api;
    /// Lets `dev` access memory of `peer` (idempotent: "already enabled" is success).
    fn enable_peer_access(dev: &<Self as Api>::Device, peer: &<Self as Api>::Device) -> Result<()>
    where
        Self: Api;
    /// Whether the device supports multicast objects (NVLS). Prefer [`nvls_supported`].
    fn multicast_supported(dev: &<Self as Api>::Device) -> Result<bool>
    where
        Self: Api;
    /// Waits for all work on the device, at most `timeout`.
    fn synchronize(dev: &<Self as Api>::Device, timeout: Duration) -> Result<()>
    where
        Self: Api;
}

/// Allocations and synchronous copies (each backend's `memory.rs`).
pub trait MemoryApi {
    /// Allocates `size` bytes of `kind` on `dev`.
    fn alloc(
        dev: &<Self as Api>::Device,
        size: usize,
        kind: MemoryKind,
    ) -> Result<<Self as Api>::Memory>
    where
        Self: Api;
    /// Sets `len` bytes at `offset` of `dst` to `value`; returns when done.
    fn memset(
        dev: &<Self as Api>::Device,
        dst: &impl Buffer,
        offset: usize,
        value: u8,
        len: usize,
    ) -> Result<()>
    where
        Self: Api;
    /// Copies host bytes into `dst` at `offset`; returns when done.
    fn write(
        dev: &<Self as Api>::Device,
        dst: &impl Buffer,
        offset: usize,
        src: &[u8],
    ) -> Result<()>
    where
        Self: Api;
    /// Copies bytes at `offset` of `src` to the host; returns when done.
    fn read(
        dev: &<Self as Api>::Device,
        src: &impl Buffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<()>
    where
        Self: Api;
    /// Copies `len` bytes between two buffers; returns when done.
    fn copy(
        dev: &<Self as Api>::Device,
        dst: &impl Buffer,
        dst_offset: usize,
        src: &impl Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()>
    where
        Self: Api;
}

/// Caller-owned host memory pinned and mapped for the device (each backend's `memory.rs`).
pub trait HostRegisterApi {
    /// Pins `len` bytes of host memory at `ptr` (memory the caller allocated, e.g. a `Vec`'s
    /// buffer) and maps them for access by every device (CUDA: `cuMemHostRegister` with
    /// `PORTABLE | DEVICEMAP`; ROCm: `hipHostRegister` with `Mapped | Portable`; host backend:
    /// nothing to do). [`HostRegisterApi::host_registration_device_ptr`] gives the address
    /// kernels use. Dropping the registration unregisters the range; a failure there is
    /// surfaced as [`Error::Deferred`] by a later `device_count` or `open_device`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a null `ptr`, a zero `len` or a range that wraps
    /// the address space; [`Error::Driver`] when the driver refuses (e.g. the range overlaps
    /// one already registered).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be one live host allocation of this process that stays allocated
    /// (not freed, unmapped or reallocated, e.g. by growing the `Vec`) until the returned
    /// registration is dropped and every device access through its device pointer has
    /// finished. Host and device accesses to the range are not synchronised by this call.
    unsafe fn register_host(
        dev: &<Self as Api>::Device,
        ptr: *mut u8,
        len: usize,
    ) -> Result<<Self as Api>::HostRegistration>
    where
        Self: Api;
    /// The device address of a registration's first byte (on the host backend: the host
    /// address itself). Valid for the registration's length while it lives.
    fn host_registration_device_ptr(r: &<Self as Api>::HostRegistration) -> u64
    where
        Self: Api;
}

/// Streams, events and the work enqueued on a stream (each backend's `stream.rs`).
pub trait StreamApi {
    /// Creates a non-blocking stream on `dev`.
    fn create_stream(dev: &<Self as Api>::Device) -> Result<<Self as Api>::Stream>
    where
        Self: Api;
    /// Waits until all work on `stream` is done, at most `timeout`.
    fn stream_synchronize(stream: &<Self as Api>::Stream, timeout: Duration) -> Result<()>
    where
        Self: Api;
    /// Creates an event with timing enabled.
    fn create_event(dev: &<Self as Api>::Device) -> Result<<Self as Api>::Event>
    where
        Self: Api;
    /// Records `event` on `stream`.
    fn record_event(event: &<Self as Api>::Event, stream: &<Self as Api>::Stream) -> Result<()>
    where
        Self: Api;
    /// Waits until the work before `event`'s last record is done, at most `timeout`.
    fn event_synchronize(event: &<Self as Api>::Event, timeout: Duration) -> Result<()>
    where
        Self: Api;
    /// Milliseconds between two completed events.
    fn event_elapsed_ms(start: &<Self as Api>::Event, end: &<Self as Api>::Event) -> Result<f32>
    where
        Self: Api;
    /// Enqueues a memset of `len` bytes at device address `dst` on `stream`.
    ///
    /// # Safety
    /// `dst..dst+len` must be device-accessible memory that stays alive until the stream has
    /// finished this work.
    unsafe fn memset_async(
        stream: &<Self as Api>::Stream,
        dst: u64,
        value: u8,
        len: usize,
    ) -> Result<()>
    where
        Self: Api;
    /// Enqueues a copy of `len` bytes between device-visible addresses (unified addressing).
    ///
    /// # Safety
    /// Both ranges must be valid, not overlapping, and alive until the stream has finished.
    unsafe fn memcpy_async(
        stream: &<Self as Api>::Stream,
        dst: u64,
        src: u64,
        len: usize,
    ) -> Result<()>
    where
        Self: Api;
    /// Enqueues a store of the 64-bit `value` at device-visible address `dst` on `stream`,
    /// ordered after the stream's earlier work and made visible with release semantics
    /// (CUDA: `cuStreamWriteValue64` with the default flags, which flush prior writes first).
    /// The host does not wait; a semaphore signal through it costs no copy-engine transfer.
    ///
    /// # Safety
    /// `dst` must be 8-byte aligned device-accessible memory alive until the stream is done.
    unsafe fn write_value64_async(
        stream: &<Self as Api>::Stream,
        dst: u64,
        value: u64,
    ) -> Result<()>
    where
        Self: Api;
}

/// Code objects and kernel launch (each backend's `module.rs`).
pub trait ModuleApi {
    /// Loads a code object (fatbin/cubin/hsaco bytes, e.g. a `CodeObject` of `mscclpp::kernels`).
    fn load_module(dev: &<Self as Api>::Device, code: &[u8]) -> Result<<Self as Api>::Module>
    where
        Self: Api;
    /// Compiles the GPU C++ `source` (named `name` in messages) at run time for devices of
    /// compute capability `arch` (major, minor: [`DeviceProperties::compute_capability`]), with
    /// the in-memory `headers` (include name, text) and extra compiler `options`, into a code
    /// object [`ModuleApi::load_module`] takes. Needs no device. CUDA: NVRTC (libnvrtc found at
    /// run time, see the backend's `rtc.rs`), the toolkit's include folder added. Backends
    /// without a run-time compiler (host, ROCm for now) answer [`Error::Unsupported`].
    fn compile_source(
        arch: (u32, u32),
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<Vec<u8>>
    where
        Self: Api,
    {
        let _ = (arch, name, source, headers, options);
        unsupported(
            "compile_source",
            Self::NAME,
            "this backend has no run-time compiler",
        )
    }
    /// Looks up an `extern "C"` kernel by name.
    fn get_kernel(module: &<Self as Api>::Module, name: &str) -> Result<<Self as Api>::Kernel>
    where
        Self: Api;
    /// Launches `kernel` with its parameters packed as in the kernel's C signature.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list laid out as a `#[repr(C)]` struct, and
    /// every pointer in it must stay valid until the kernel finishes.
    unsafe fn launch_raw(
        kernel: &<Self as Api>::Kernel,
        cfg: &LaunchConfig,
        stream: &<Self as Api>::Stream,
        args: &[u8],
    ) -> Result<()>
    where
        Self: Api;
    /// Launches `kernel` with a `#[repr(C)]` argument struct whose fields are the kernel's
    /// parameters in order.
    ///
    /// # Safety
    /// As [`ModuleApi::launch_raw`]: `T` must be `#[repr(C)]` and match the kernel's
    /// parameters.
    unsafe fn launch<T: Copy>(
        kernel: &<Self as Api>::Kernel,
        cfg: &LaunchConfig,
        stream: &<Self as Api>::Stream,
        args: &T,
    ) -> Result<()>
    where
        Self: Api,
    {
        // SAFETY: T is a plain Copy struct; viewing it as bytes is fine (padding bytes are only
        // copied, never interpreted as values by us).
        let bytes = unsafe {
            std::slice::from_raw_parts((args as *const T).cast::<u8>(), std::mem::size_of::<T>())
        };
        // SAFETY: forwarded from the caller.
        unsafe { Self::launch_raw(kernel, cfg, stream, bytes) }
    }
}

/// Exporting allocations to other processes and importing theirs (each backend's `ipc.rs`).
pub trait IpcApi {
    /// The IPC kinds `mem` can be exported as, preferred first (may be empty).
    fn ipc_kinds(mem: &<Self as Api>::Memory) -> Vec<IpcKind>
    where
        Self: Api;
    /// Exports `mem` as `kind`. Fd kinds register the fd with this process's fd server
    /// ([`auxil::fdpass`]) for as long as `mem` lives.
    fn export(mem: &<Self as Api>::Memory, kind: IpcKind) -> Result<IpcDescriptor>
    where
        Self: Api;
    /// Maps memory exported by another process (or this one) on `dev`.
    fn import(dev: &<Self as Api>::Device, desc: &IpcDescriptor) -> Result<<Self as Api>::Imported>
    where
        Self: Api;
    /// The allocation holding `ptr..ptr+len` that the caller made outside this library (e.g.
    /// `cudaMalloc`, a cuMem/VMM mapping, a host memfd mapping), as memory that can be
    /// exported like an allocation of [`MemoryApi::alloc`] but is never freed by this library:
    /// its `device_ptr` is the allocation's base (the identity's `base`) and dropping it only
    /// releases what adopting took (a retained handle, a file descriptor). An error names the
    /// pointer and why it cannot be shared (private host memory, managed memory, VMM memory
    /// made without a shareable handle type, a range spanning two allocations). The caller
    /// keeps the allocation alive while exports of it are used.
    fn adopt(
        dev: &<Self as Api>::Device,
        ptr: u64,
        len: usize,
    ) -> Result<(<Self as Api>::Memory, AllocationIdentity)>
    where
        Self: Api;
    /// The identity of the allocation holding `ptr..ptr+len` now (no export; a few driver
    /// queries), to tell whether an earlier adoption still names the memory there.
    fn identity(dev: &<Self as Api>::Device, ptr: u64, len: usize) -> Result<AllocationIdentity>
    where
        Self: Api;
}

/// The HAL traits, for code that calls them on a concrete backend (`Gpu::alloc(..)`).
pub mod prelude {
    pub use crate::{
        Api, Buffer, DeviceApi, DmaBufApi, HostRegisterApi, IpcApi, MemoryApi, ModuleApi,
        MulticastApi, StreamApi,
    };
}
