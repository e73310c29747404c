//! The host backend: one "device" (the CPU), memory in shared memfd mappings.
//!
//! A device pointer is the host virtual address of the mapping. Copies are `memcpy`, streams
//! complete every operation before returning, events record wall-clock instants, and kernel
//! launch is [`crate::Error::Unsupported`]. Memory is `MAP_SHARED` over a memfd, so another
//! process that imports it (fd passed over [`crate::auxil::fdpass`]) sees the same physical
//! pages and atomics work across processes.
//!
//! Each behaviour trait is implemented in its file: [`crate::DeviceApi`] in `device.rs`,
//! [`crate::MemoryApi`] and [`crate::HostRegisterApi`] in `memory.rs`, [`crate::StreamApi`]
//! in `stream.rs`, [`crate::ModuleApi`] in `module.rs`, [`crate::IpcApi`] in `ipc.rs`,
//! [`crate::MulticastApi`] (an emulation of NVLink multicast over memfd mappings) in
//! `multicast.rs`.

mod budget;
mod device;
mod graph;
mod ipc;
mod memory;
mod module;
mod multicast;
mod stream;

pub use device::HostDevice;
pub use graph::HostGraph;
pub use ipc::HostImported;
pub use memory::{HostMemory, HostRegistration};
pub use module::{HostKernel, HostModule};
pub use multicast::{
    multicast_members, HostMulticast, HostMulticastBinding, HostMulticastExport,
    HostMulticastMapping, MulticastMembers,
};
pub use stream::{HostEvent, HostStream};

use crate::Api;

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
    type Multicast = HostMulticast;
    type MulticastExport = HostMulticastExport;
    type MulticastBinding = HostMulticastBinding;
    type MulticastMapping = HostMulticastMapping;
}
