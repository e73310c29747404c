//! MSCCL++ in Rust: the primitives with which GPU kernels communicate themselves (bootstrap,
//! connections, registered memory, semaphores, memory/port/switch channels, the proxy), and the
//! collectives and executor built on them.
//!
//! # What it is for
//!
//! A communication library like NCCL owns the whole operation: you call `ncclAllReduce` and
//! its kernel moves the data. This crate gives the kernel *you* write the means to move data
//! itself. The host side sets up, once, everything that needs the operating system or the
//! peers (who the ranks are, which memory each can reach, which transports connect them) and
//! hands out *device handles*: small `#[repr(C)]` values, each the image of a C++ struct in
//! `kernels/cuda/include/mscclpp/`, that a kernel takes as an argument and uses without any
//! further help from the host:
//!
//! | host object | device handle | what a GPU thread does with it |
//! |---|---|---|
//! | [`MemoryChannel`] | [`MemoryChannelDeviceHandle`] | `put`/`get` into a peer GPU's memory mapped here (NVLink, PCIe), LL packets, `signal`/`wait` |
//! | [`PortChannel`] | [`PortChannelDeviceHandle`] | pushes requests into a FIFO; the [`ProxyService`] thread performs them (IB RDMA, Ethernet, copies) |
//! | [`SwitchChannel`] | [`SwitchChannelDeviceHandle`] | NVLink SHARP (NVLS) multicast loads, reductions and stores |
//! | [`MemoryDevice2DeviceSemaphore`], [`Host2DeviceSemaphore`] | their `...DeviceHandle`s | `signal` a peer, `wait` for it |
//!
//! On top of these, [`collectives`] implements all-reduce, all-gather, reduce-scatter and
//! broadcast (what `libmscclpp_nccl.so` exposes through NCCL's ABI), and [`executor`] runs
//! MSCCL++ JSON execution plans.
//!
//! # What it promises, and what it leaves to you
//!
//! The host side checks everything it can: ranges against registered sizes, transports
//! against what memory was registered for, every wire message and serialized blob (a
//! malformed one is an [`Error`] naming what was expected, never a panic), and every blocking
//! host call takes a timeout and reports a dead or silent peer by its rank. No call panics on
//! input a peer, a file or the environment controls.
//!
//! The device side checks nothing, as on the GPU: a handle is a handful of raw pointers, and
//! offsets, sizes and the pairing of signals and waits are the kernel's business. A `put` past
//! the end of the peer's buffer writes past it; a `wait` without a matching `signal` spins
//! (the GPU's until its spin bound; [`device_emu`]'s until its timeout). Which rank writes
//! which memory when, and when a buffer may be reused, is the protocol you design: a signal
//! is ordered after the writes before it on its channel, and the waiter sees them after its
//! wait returns: that, and no more, is what the library guarantees between peers. Every rank
//! must make the collective setup calls (connecting, exchanging memory, building semaphores,
//! creating [`collectives::Collectives`]) in the same order with the same tags.
//!
//! # Quick start
//!
//! Run ranks (one process per GPU, or threads for a test), give them a [`TcpBootstrap`],
//! wrap it in a [`Communicator`], [`Communicator::connect`] to peers,
//! [`Communicator::register_memory`] and swap it with [`Communicator::send_memory`] /
//! [`Communicator::recv_memory`], build a semaphore with [`Communicator::build_semaphore`],
//! then a channel, then pass its `device_handle()` to a kernel. The README's snippet does all
//! of it in 40 lines (and runs as a doctest); `core/examples/` goes step by step, from
//! `01-bootstrap` to `09-allreduce`, each runnable with `cargo run -p mscclpp --example NAME`.
//!
//! ```
//! use std::time::Duration;
//! // One rank alone: a bootstrap of one, a communicator, a buffer registered for CudaIpc.
//! let id = mscclpp::TcpBootstrap::create_unique_id()?;
//! let mut bootstrap = mscclpp::TcpBootstrap::new(0, 1)?;
//! bootstrap.initialize_with_id(&id, Duration::from_secs(10))?;
//! let comm = mscclpp::Communicator::new(std::sync::Arc::new(bootstrap), mscclpp::Context::new()?);
//! let buf = mscclpp::GpuBuffer::<u32>::new(mscclpp::Device::CPU, 1024)?;
//! let reg = comm.register_memory(buf.data(), buf.bytes(), mscclpp::Transport::CudaIpc.into())?;
//! assert_eq!(reg.size(), 4096);
//! # Ok::<(), mscclpp::Error>(())
//! ```
//!
//! # Cargo features
//!
//! | feature | backend | needs |
//! |---|---|---|
//! | (none) | host: CPU memory, CPU threads play the device ([`device_emu`]) | nothing |
//! | `cuda` | NVIDIA GPUs through `mscclpp-hal`'s CUDA backend (cudarc) | nvcc to build; libcuda at run time, loaded dynamically |
//! | `rocm` | AMD GPUs through `mscclpp-hal`'s HIP backend | hipcc to build; libamdhip64 at run time |
//!
//! The API is the same on every backend; what a [`Device`] is and where [`GpuBuffer`]
//! allocates changes. The host backend is not a mock: the same protocols run on the same
//! handles with the memory orderings of the CUDA headers, which is how this crate is tested
//! on machines without a GPU. IB needs no feature: libibverbs is loaded at run time
//! (`MSCCLPP_IBV_SO` picks the library), so every build can use it where a device exists.
//!
//! # Thread safety
//!
//! The host objects are `Send + Sync` and meant to be shared: [`Context`], [`Communicator`],
//! [`Connection`] and [`RegisteredMemory`] are cheap clones of one shared object, and
//! [`collectives::Collectives`] serializes its calls internally. A [`Connection`] may be shared
//! between threads; [`Connection::flush`] waits for every operation issued on it before. A bootstrap's messages between
//! one pair of ranks under one tag arrive in the order sent; collective calls (barriers,
//! setup) must be made by every rank in the same order, from one thread at a time per rank.
//! On the device side one thread at a time may `wait`/`poll` a given semaphore or channel
//! handle (they advance a counter non-atomically, as in the CUDA headers); `signal`, `put`
//! and the FIFO push may be called from many threads at once.
//!
//! # Device handles and the lifetimes of their host objects
//!
//! A device handle is `Copy` and carries no lifetime: it is meant to cross into a kernel, which
//! no borrow checker sees. It stays valid exactly as long as the host object it came from
//! (and everything that object holds: the registered memory, the semaphore's token memory,
//! the connection, the proxy and its FIFO) is alive and, for port channels, the proxy is
//! running. Dropping the channel while a kernel still uses its handle is a use-after-free on
//! the device. So: keep the host objects until the kernel finished (synchronize its stream),
//! stop the proxy ([`ProxyService::stop_proxy`], also done on drop) only after the kernels
//! that push to it are done, and keep a peer's memory mapped until the peer said it stopped
//! writing (a barrier or a last signal). This is why every function that dereferences a
//! handle on the host backend ([`device_emu`]) is `unsafe`, and why the examples end with a
//! barrier before dropping anything.

// No unwrap() a peer, a file or the environment could make panic (tests may).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

/// `Send` and `Sync` for device handles: `#[repr(C)]` plain addresses and ids that kernels
/// (or the emulated device threads) use. The memory they name is shared by design and accessed
/// only with the protocol's atomics or multimem operations; the host never dereferences it
/// through these types, so moving a handle between threads is what device threads do with it.
macro_rules! device_handle_thread_safe {
    ($($t:ty),+ $(,)?) => {$(
        // SAFETY: see the macro's documentation.
        unsafe impl Send for $t {}
        // SAFETY: as above.
        unsafe impl Sync for $t {}
    )+};
}

pub mod backoff;
pub mod bootstrap;
pub mod collectives;
pub mod communicator;
pub mod connection;
pub mod context;
pub mod device_emu;
pub mod endpoint;
pub mod env;
pub mod error;
pub mod executor;
pub mod fifo;
pub mod future;
pub mod gpu_buffer;
#[allow(rustdoc::private_intra_doc_links)] // its docs link its private parts (mr, qp)
pub mod ib;
pub mod identity;
pub mod kernels;
pub mod logger;
pub mod memory;
pub mod memory_channel;
pub mod nvls;
pub mod p2p;
pub mod packet;
pub mod port_channel;
pub mod proxy;
pub mod registered_memory;
pub mod semaphore;
mod serialize;
pub mod switch_channel;
pub mod transport;

pub use bootstrap::{Bootstrap, InitAddr, TcpBootstrap, UniqueId};
pub use env::{env, Env};
pub use error::{Error, ErrorCode, Result};
pub use transport::{
    Device, DeviceType, EndpointConfig, IbConfig, IbMode, Transport, TransportFlags,
    ALL_IB_TRANSPORTS,
};

pub use communicator::{Communicator, COMM_TAG_BASE};
pub use connection::{BaseConnection, Connection};
pub use context::Context;
pub use endpoint::Endpoint;
pub use future::Future;
pub use memory::LocalMemory;
pub use nvls::{connect_nvls_collective, nvls_usable, NvlsConnection};
pub use registered_memory::RegisteredMemory;
pub use semaphore::{
    Host2DeviceSemaphore, Host2DeviceSemaphoreDeviceHandle, Host2HostSemaphore,
    MemoryDevice2DeviceSemaphore, MemoryDevice2DeviceSemaphoreDeviceHandle, Semaphore,
    SemaphoreStub,
};

pub use fifo::{Fifo, FifoDeviceHandle, ProxyTrigger};
pub use gpu_buffer::{gpu_calloc, gpu_memcpy, GpuBuffer};
pub use memory_channel::{
    BaseMemoryChannel, BaseMemoryChannelDeviceHandle, MemoryChannel, MemoryChannelDeviceHandle,
};
pub use packet::{LL16Packet, LL8Packet};
pub use port_channel::{
    BasePortChannel, BasePortChannelDeviceHandle, MemoryId, PortChannel, PortChannelDeviceHandle,
    SemaphoreId,
};
pub use proxy::ProxyService;
pub use switch_channel::{SwitchChannel, SwitchChannelDeviceHandle};

/// The README's Rust snippets, compiled and run as doctests (`cargo test -p mscclpp --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
