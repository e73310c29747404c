//! Switch channels: one buffer bound to an NVLink multicast object ([`crate::NvlsConnection`]),
//! so device code reduces every rank's copy in the switch (`multimem.ld_reduce`) and writes all
//! copies at once (`multimem.st`) through the multicast address.
//!
//! The host object keeps the binding and the mapping alive: keep a channel alive while any
//! kernel (or CPU "device" thread) uses its handle. The device operations are in
//! `kernels/cuda/include/mscclpp/switch_channel_device.hpp` (CUDA, sm_90 and newer) and, for
//! the host backend's emulation, in [`crate::device_emu::switch_channel`].

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

/// `struct SwitchChannelDeviceHandle` of the C header (size 24).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SwitchChannelDeviceHandle {
    /// This rank's buffer (its own copy, plain device memory).
    pub device_ptr: *mut c_void,
    /// The buffer's multicast address: loads reduce over every rank's copy, stores reach all.
    pub mc_ptr: *mut c_void,
    /// Bytes of the buffer.
    pub buffer_size: u64,
}

device_handle_thread_safe!(SwitchChannelDeviceHandle);

/// A buffer bound to a multicast object at some offset, with its multicast address. Made by
/// [`crate::NvlsConnection::bind_allocated_memory`]; dropping the last clone unmaps the
/// multicast range, unbinds the buffer and returns the range to the connection.
#[derive(Clone)]
pub struct SwitchChannel {
    device_ptr: u64,
    mc_ptr: u64,
    buffer_size: usize,
    mc_offset: usize,
    _keep: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for SwitchChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchChannel")
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr))
            .field("mc_ptr", &format_args!("{:#x}", self.mc_ptr))
            .field("buffer_size", &self.buffer_size)
            .field("mc_offset", &self.mc_offset)
            .finish()
    }
}

impl SwitchChannel {
    /// A channel over a bound buffer; `keep` owns the binding, the mapping and the memory.
    pub(crate) fn new(
        device_ptr: u64,
        mc_ptr: u64,
        buffer_size: usize,
        mc_offset: usize,
        keep: Arc<dyn Any + Send + Sync>,
    ) -> SwitchChannel {
        SwitchChannel {
            device_ptr,
            mc_ptr,
            buffer_size,
            mc_offset,
            _keep: keep,
        }
    }
    /// This rank's buffer (the address that was bound).
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
    /// The multicast address of the buffer's first byte.
    pub fn mc_ptr(&self) -> u64 {
        self.mc_ptr
    }
    /// Bytes of the buffer (as asked for; the binding is rounded up to the granularity).
    pub fn buffer_size(&self) -> usize {
        self.buffer_size
    }
    /// Where the buffer sits in the connection's multicast object.
    pub fn mc_offset(&self) -> usize {
        self.mc_offset
    }
    /// The `#[repr(C)]` handle device code uses. Valid while `self` lives.
    pub fn device_handle(&self) -> SwitchChannelDeviceHandle {
        SwitchChannelDeviceHandle {
            device_ptr: self.device_ptr as usize as *mut c_void,
            mc_ptr: self.mc_ptr as usize as *mut c_void,
            buffer_size: self.buffer_size as u64,
        }
    }
}
