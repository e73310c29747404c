//! Port channels: device threads push requests into the proxy FIFO; the host proxy
//! ([`crate::proxy::ProxyService`]) performs the transfers over the semaphore's connection and
//! signals the peer. Incoming signals arrive through a Host2DeviceSemaphore.
//!
//! The channels keep the proxy's shared state (FIFO, semaphores, memories) alive, so their
//! device handles stay valid as long as a channel lives. The device operations for the host
//! backend are in [`crate::device_emu::port_channel`].

use std::any::Any;
use std::sync::Arc;

use crate::fifo::FifoDeviceHandle;
use crate::semaphore::Host2DeviceSemaphoreDeviceHandle;

/// Index of a semaphore added to a proxy service (< 1024).
pub type SemaphoreId = u32;
/// Index of a memory added to a proxy service (< 512).
pub type MemoryId = u32;

/// `struct BasePortChannelDeviceHandle` of the C header (size 64).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BasePortChannelDeviceHandle {
    /// The proxy's id of the semaphore (travels in every trigger).
    pub semaphore_id: SemaphoreId,
    /// Padding.
    pub pad: u32,
    /// The Host2Device semaphore the proxy (on the peer's behalf) signals.
    pub semaphore: Host2DeviceSemaphoreDeviceHandle,
    /// The proxy's FIFO.
    pub fifo: FifoDeviceHandle,
}

/// `struct PortChannelDeviceHandle` of the C header (size 72).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PortChannelDeviceHandle {
    /// Semaphore and FIFO.
    pub base: BasePortChannelDeviceHandle,
    /// Proxy memory id of the destination (the peer's memory).
    pub dst: MemoryId,
    /// Proxy memory id of the source (local memory).
    pub src: MemoryId,
}

device_handle_thread_safe!(BasePortChannelDeviceHandle, PortChannelDeviceHandle);

/// A semaphore of a proxy service plus its FIFO: put/signal/flush with explicit memory ids.
#[derive(Clone)]
pub struct BasePortChannel {
    semaphore_id: SemaphoreId,
    handle: BasePortChannelDeviceHandle,
    /// The proxy's shared state (FIFO, semaphores, memories), kept alive by the channel. Typed
    /// as `Any` so this module stays below [`crate::proxy`], which builds the channels.
    _keep_alive: Arc<dyn Any + Send + Sync>,
}

impl BasePortChannel {
    pub(crate) fn new(
        semaphore_id: SemaphoreId,
        semaphore: Host2DeviceSemaphoreDeviceHandle,
        fifo: FifoDeviceHandle,
        keep_alive: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        BasePortChannel {
            semaphore_id,
            handle: BasePortChannelDeviceHandle {
                semaphore_id,
                pad: 0,
                semaphore,
                fifo,
            },
            _keep_alive: keep_alive,
        }
    }
    /// The proxy's id of the semaphore.
    pub fn semaphore_id(&self) -> SemaphoreId {
        self.semaphore_id
    }
    /// The `#[repr(C)]` handle device code uses. Valid while `self` (or its proxy) lives.
    pub fn device_handle(&self) -> BasePortChannelDeviceHandle {
        self.handle
    }
}

/// A [`BasePortChannel`] bound to a destination and a source memory.
#[derive(Clone)]
pub struct PortChannel {
    base: BasePortChannel,
    dst: MemoryId,
    src: MemoryId,
}

impl PortChannel {
    pub(crate) fn new(base: BasePortChannel, dst: MemoryId, src: MemoryId) -> Self {
        PortChannel { base, dst, src }
    }
    /// The base channel.
    pub fn base(&self) -> &BasePortChannel {
        &self.base
    }
    /// Destination memory id.
    pub fn dst(&self) -> MemoryId {
        self.dst
    }
    /// Source memory id.
    pub fn src(&self) -> MemoryId {
        self.src
    }
    /// The `#[repr(C)]` handle device code uses. Valid while `self` (or its proxy) lives.
    pub fn device_handle(&self) -> PortChannelDeviceHandle {
        PortChannelDeviceHandle {
            base: self.base.device_handle(),
            dst: self.dst,
            src: self.src,
        }
    }
}
