//! The CUDA backend: cudarc's driver bindings with dynamic loading.
//!
//! The binary starts without libcuda: the first call checks that the library is present and
//! returns [`crate::Error::NoDriver`] (listing every name tried) when it is not. Memory comes
//! from cuMemAlloc / cuMemHostAlloc / cuMem VMM (never the stream-ordered pool, which peers
//! cannot touch). Multicast objects (NVLS, `multicast.rs`) are refused before any driver call
//! while the environment disables NVLS.
//!
//! Three layers, as in cudarc: `cudarc::driver::sys` (raw bindings), `result.rs` (thin checked
//! wrappers, grouped by topic, each linking the driver documentation; the only place that
//! calls `sys` functions) and the safe types, one behaviour trait per file: `device.rs`
//! ([`crate::DeviceApi`]), `memory.rs` ([`crate::MemoryApi`], [`crate::HostRegisterApi`]),
//! `stream.rs` ([`crate::StreamApi`]), `module.rs` ([`crate::ModuleApi`]), `ipc.rs`
//! ([`crate::IpcApi`]), `multicast.rs` ([`crate::MulticastApi`]); `conv.rs` maps between our
//! types and the driver's.

mod conv;
mod device;
mod dmabuf;
mod graph;
mod ipc;
mod memory;
mod module;
mod multicast;
mod result;
mod stream;

pub use device::CudaDevice;
pub use graph::CudaGraph;
pub use ipc::CudaImported;
pub use memory::{CudaHostRegistration, CudaMemory};
pub use module::{CudaKernel, CudaModule};
pub use multicast::{
    CudaMulticast, CudaMulticastBinding, CudaMulticastExport, CudaMulticastMapping,
};
pub use stream::{CudaEvent, CudaStream};

use crate::Api;

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
    type Multicast = CudaMulticast;
    type MulticastExport = CudaMulticastExport;
    type MulticastBinding = CudaMulticastBinding;
    type MulticastMapping = CudaMulticastMapping;
}
