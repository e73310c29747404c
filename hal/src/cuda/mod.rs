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
//! types and the driver's. `rtc.rs` is NVRTC (run-time compilation, behind
//! [`crate::ModuleApi::compile_source`]): a library of its own, found and called there.

mod conv;
mod device;
mod dmabuf;
mod graph;
mod ipc;
mod memory;
mod module;
mod multicast;
mod result;
mod rtc;
mod stream;

backend_api! { Cuda, "cuda", host_addressable: false, graph: graph::CudaGraph,
device::CudaDevice, memory::CudaMemory, ipc::CudaImported, stream::CudaStream,
stream::CudaEvent, module::CudaModule, module::CudaKernel, memory::CudaHostRegistration,
multicast::CudaMulticast, multicast::CudaMulticastExport, multicast::CudaMulticastBinding,
multicast::CudaMulticastMapping, }
