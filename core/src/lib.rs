//! MSCCL++ in Rust: bootstrap, connections, registered memory, semaphores, channels, proxy.

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
pub mod ib;
pub mod identity;
pub mod logger;
pub mod memory;
pub mod memory_channel;
pub mod nvls;
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
