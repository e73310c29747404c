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

pub use multicast::{multicast_members, MulticastMembers};

backend_api! { Host, "host", host_addressable: true, graph: graph::HostGraph,
device::HostDevice, memory::HostMemory, ipc::HostImported, stream::HostStream,
stream::HostEvent, module::HostModule, module::HostKernel, memory::HostRegistration,
multicast::HostMulticast, multicast::HostMulticastExport, multicast::HostMulticastBinding,
multicast::HostMulticastMapping, }
