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

pub use ipc::HipOpener;

backend_api! { Rocm, "rocm", host_addressable: false, graph: graph::RocmGraph,
device::RocmDevice, memory::RocmMemory, ipc::RocmImported, stream::RocmStream,
stream::RocmEvent, module::RocmModule, module::RocmKernel, memory::RocmHostRegistration,
multicast::RocmMulticast, multicast::RocmMulticastExport, multicast::RocmMulticastBinding,
multicast::RocmMulticastMapping, }
