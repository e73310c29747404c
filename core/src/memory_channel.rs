//! Memory channels: device threads move data to/from a peer's memory directly (NVLink/PCIe
//! peer mappings on GPUs; shared memfd mappings on the host backend) and synchronize through a
//! [`MemoryDevice2DeviceSemaphore`].
//!
//! The host objects own what the device handles point at: keep a channel alive while any
//! kernel (or CPU "device" thread) uses its handle. The device operations for the host backend
//! are in [`crate::device_emu::memory_channel`].

use std::ffi::c_void;

use crate::error::{Error, Result};
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::{MemoryDevice2DeviceSemaphore, MemoryDevice2DeviceSemaphoreDeviceHandle};

/// `struct BaseMemoryChannelDeviceHandle` of the C header (size 24).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BaseMemoryChannelDeviceHandle {
    /// The semaphore's device handle.
    pub semaphore: MemoryDevice2DeviceSemaphoreDeviceHandle,
}

/// `struct MemoryChannelDeviceHandle` of the C header (size 48).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemoryChannelDeviceHandle {
    /// The semaphore's device handle.
    pub semaphore: MemoryDevice2DeviceSemaphoreDeviceHandle,
    /// The peer's registered buffer, mapped here.
    pub dst: *mut c_void,
    /// This rank's local buffer.
    pub src: *mut c_void,
    /// This rank's packet buffer (the peer's `put_packets` target), or null.
    pub packet_buffer: *mut c_void,
}

device_handle_thread_safe!(MemoryChannelDeviceHandle, BaseMemoryChannelDeviceHandle);

/// A channel with only a semaphore: signal/wait between two devices.
pub struct BaseMemoryChannel {
    semaphore: MemoryDevice2DeviceSemaphore,
}

impl BaseMemoryChannel {
    /// A channel over `semaphore`.
    pub fn new(semaphore: MemoryDevice2DeviceSemaphore) -> Self {
        BaseMemoryChannel { semaphore }
    }
    /// The semaphore.
    pub fn semaphore(&self) -> &MemoryDevice2DeviceSemaphore {
        &self.semaphore
    }
    /// The `#[repr(C)]` handle device code uses. Valid while `self` lives.
    pub fn device_handle(&self) -> BaseMemoryChannelDeviceHandle {
        BaseMemoryChannelDeviceHandle {
            semaphore: self.semaphore.device_handle(),
        }
    }
}

/// A semaphore plus a remote destination, a local source and an optional local packet buffer.
pub struct MemoryChannel {
    semaphore: MemoryDevice2DeviceSemaphore,
    dst: RegisteredMemory,
    src: u64,
    packet_buffer: u64,
}

impl MemoryChannel {
    /// A channel writing into `dst` (the peer's memory, mapped in this process) from the local
    /// address `src`; `packet_buffer` is the local buffer the peer's packets land in.
    pub fn new(
        semaphore: MemoryDevice2DeviceSemaphore,
        dst: RegisteredMemory,
        src: u64,
        packet_buffer: Option<u64>,
    ) -> Result<Self> {
        if dst.data() == 0 {
            return Err(Error::invalid(format!(
                "MemoryChannel::new: expected a destination mapped in this process (registered with CudaIpc on this host), got memory {:#x} (+{} bytes) reachable only remotely",
                dst.original_data_ptr(),
                dst.size()
            )));
        }
        if src == 0 {
            return Err(Error::invalid(
                "MemoryChannel::new: expected a non-null source address, got 0",
            ));
        }
        Ok(MemoryChannel {
            semaphore,
            dst,
            src,
            packet_buffer: packet_buffer.unwrap_or(0),
        })
    }

    /// [`MemoryChannel::new`] with a registered local source.
    pub fn with_registered_src(
        semaphore: MemoryDevice2DeviceSemaphore,
        dst: RegisteredMemory,
        src: &RegisteredMemory,
        packet_buffer: Option<u64>,
    ) -> Result<Self> {
        Self::new(semaphore, dst, src.data(), packet_buffer)
    }

    /// The semaphore.
    pub fn semaphore(&self) -> &MemoryDevice2DeviceSemaphore {
        &self.semaphore
    }
    /// The remote destination.
    pub fn dst(&self) -> &RegisteredMemory {
        &self.dst
    }

    /// The `#[repr(C)]` handle device code uses. Valid while `self` lives.
    pub fn device_handle(&self) -> MemoryChannelDeviceHandle {
        MemoryChannelDeviceHandle {
            semaphore: self.semaphore.device_handle(),
            dst: self.dst.data() as usize as *mut c_void,
            src: self.src as usize as *mut c_void,
            packet_buffer: self.packet_buffer as usize as *mut c_void,
        }
    }
}
