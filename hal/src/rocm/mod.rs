//! The ROCm backend: HIP resolved at run time (libloading), hip-sys for opaque types.
//!
//! The binary starts without ROCm: the first call loads `libamdhip64.so` (`.so.7`, `.so.6`,
//! `.so.5`) and returns [`crate::Error::NoDriver`] listing every name tried when none loads.
//! IPC goes through the AMD IPC handle cache. Multicast (NVLS) is never supported here.
//!
//! Three layers, as for CUDA: `sys.rs` (the function table loaded at run time), `result.rs`
//! (thin checked wrappers, grouped by topic; the only place that calls the table) and the safe
//! types, one behaviour trait per file: `device.rs` ([`crate::DeviceApi`]), `memory.rs`
//! ([`crate::MemoryApi`], [`crate::HostRegisterApi`]), `stream.rs` ([`crate::StreamApi`]),
//! `module.rs` ([`crate::ModuleApi`]), `ipc.rs` ([`crate::IpcApi`]), `multicast.rs`
//! ([`crate::MulticastApi`]: unsupported); `conv.rs` holds the HIP constants and handle
//! conversions.

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
mod sys;

pub use device::RocmDevice;
pub use graph::RocmGraph;
pub use ipc::HipOpener;
pub use ipc::RocmImported;
pub use memory::{RocmHostRegistration, RocmMemory};
pub use module::{RocmKernel, RocmModule};
pub use multicast::{
    RocmMulticast, RocmMulticastBinding, RocmMulticastExport, RocmMulticastMapping,
};
pub use stream::{RocmEvent, RocmStream};

use crate::Api;

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
    type Multicast = RocmMulticast;
    type MulticastExport = RocmMulticastExport;
    type MulticastBinding = RocmMulticastBinding;
    type MulticastMapping = RocmMulticastMapping;
}
