//! Memory channel device operations on the host backend (`memory_channel_device.hpp`).
//!
//! Cooperative operations (put/get/put_packets/unpack_packets) are called by all
//! `num_threads` threads with the same arguments; signal/wait/poll by one thread per handle.
//! All methods are `unsafe`: the handle's pointers must belong to live host objects and the
//! offsets must stay inside the buffers (as on the GPU, nothing checks them).

use std::time::Duration;

use super::{copy, packet, semaphore};
use crate::error::{Error, Result};
use crate::memory_channel::{BaseMemoryChannelDeviceHandle, MemoryChannelDeviceHandle};
use crate::semaphore::MemoryDevice2DeviceSemaphoreDeviceHandle;

use super::packet::HostPacket;

/// The semaphore operations of a memory-device-to-device handle.
pub trait MemorySemaphoreOps {
    /// The semaphore handle.
    fn sem(&self) -> &MemoryDevice2DeviceSemaphoreDeviceHandle;

    /// One release fetch-add on the peer's inbound token.
    ///
    /// # Safety
    /// The handle's host objects are alive.
    unsafe fn signal(&self) {
        // SAFETY: forwarded from the caller.
        unsafe { semaphore::signal(self.sem().remote_inbound_token) }
    }
    /// A relaxed fetch-add on the peer's inbound token.
    ///
    /// # Safety
    /// As [`MemorySemaphoreOps::signal`].
    unsafe fn relaxed_signal(&self) {
        // SAFETY: forwarded from the caller.
        unsafe { semaphore::relaxed_signal(self.sem().remote_inbound_token) }
    }
    /// Non-blocking wait.
    ///
    /// # Safety
    /// As [`MemorySemaphoreOps::signal`]; one waiter per handle.
    unsafe fn poll(&self) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { semaphore::poll(self.sem().inbound_token, self.sem().expected_inbound_token) }
    }
    /// Waits for the next signal, at most `timeout`.
    ///
    /// # Safety
    /// As [`MemorySemaphoreOps::poll`].
    unsafe fn wait(&self, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            semaphore::wait(
                self.sem().inbound_token,
                self.sem().expected_inbound_token,
                timeout,
            )
        }
    }
    /// [`MemorySemaphoreOps::wait`] with relaxed loads.
    ///
    /// # Safety
    /// As [`MemorySemaphoreOps::poll`].
    unsafe fn relaxed_wait(&self, timeout: Duration) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            semaphore::relaxed_wait(
                self.sem().inbound_token,
                self.sem().expected_inbound_token,
                timeout,
            )
        }
    }
}

impl MemorySemaphoreOps for MemoryDevice2DeviceSemaphoreDeviceHandle {
    fn sem(&self) -> &MemoryDevice2DeviceSemaphoreDeviceHandle {
        self
    }
}
impl MemorySemaphoreOps for BaseMemoryChannelDeviceHandle {
    fn sem(&self) -> &MemoryDevice2DeviceSemaphoreDeviceHandle {
        &self.semaphore
    }
}
impl MemorySemaphoreOps for MemoryChannelDeviceHandle {
    fn sem(&self) -> &MemoryDevice2DeviceSemaphoreDeviceHandle {
        &self.semaphore
    }
}

fn nonnull(what: &str, p: *mut std::ffi::c_void) -> Result<*mut u8> {
    if p.is_null() {
        return Err(Error::invalid(format!(
            "memory channel: expected a {what} address, got null"
        )));
    }
    Ok(p.cast())
}

impl MemoryChannelDeviceHandle {
    /// The peer's `dst + target_offset` and the local `src + origin_offset`; an error when
    /// either buffer is null.
    ///
    /// # Safety
    /// Both offsets lie inside their buffers.
    unsafe fn dst_src(&self, target_offset: u64, origin_offset: u64) -> Result<(*mut u8, *mut u8)> {
        let d = nonnull("destination", self.dst)?;
        let s = nonnull("source", self.src)?;
        // SAFETY: forwarded from the caller.
        Ok(unsafe { (d.add(target_offset as usize), s.add(origin_offset as usize)) })
    }

    /// Copies `bytes` from `src + origin_offset` to the peer's `dst + target_offset`.
    ///
    /// # Safety
    /// The handle's host objects are alive and both ranges lie inside their buffers.
    pub unsafe fn put(
        &self,
        target_offset: u64,
        origin_offset: u64,
        bytes: u64,
        thread_id: u32,
        num_threads: u32,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            let (d, s) = self.dst_src(target_offset, origin_offset)?;
            copy::copy(d, s, bytes, thread_id, num_threads)
        }
    }

    /// Copies `bytes` from the peer's `dst + target_offset` to `src + origin_offset`.
    ///
    /// # Safety
    /// As [`MemoryChannelDeviceHandle::put`].
    pub unsafe fn get(
        &self,
        target_offset: u64,
        origin_offset: u64,
        bytes: u64,
        thread_id: u32,
        num_threads: u32,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            let (d, s) = self.dst_src(target_offset, origin_offset)?;
            copy::copy(s, d, bytes, thread_id, num_threads)
        }
    }

    /// Loads element `index` of type `T` from the remote buffer.
    ///
    /// # Safety
    /// As [`MemoryChannelDeviceHandle::put`]; `T` plain data.
    pub unsafe fn read<T: Copy>(&self, index: u64) -> T {
        // SAFETY: forwarded from the caller.
        unsafe { self.dst.cast::<T>().add(index as usize).read_volatile() }
    }

    /// Stores `v` as element `index` of type `T` of the remote buffer.
    ///
    /// # Safety
    /// As [`MemoryChannelDeviceHandle::read`].
    pub unsafe fn write<T: Copy>(&self, index: u64, v: T) {
        // SAFETY: forwarded from the caller.
        unsafe { self.dst.cast::<T>().add(index as usize).write_volatile(v) }
    }

    /// Packs `bytes` of `src + origin_offset` into packets at the peer's `dst + target_offset`.
    ///
    /// # Safety
    /// As [`MemoryChannelDeviceHandle::put`]; the packet range holds `bytes / P::PAYLOAD_BYTES` packets.
    pub unsafe fn put_packets<P: HostPacket>(
        &self,
        target_offset: u64,
        origin_offset: u64,
        bytes: u64,
        thread_id: u32,
        num_threads: u32,
        flag: u32,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            let (d, s) = self.dst_src(target_offset, origin_offset)?;
            packet::copy_to_packets(d.cast::<P>(), s, bytes, thread_id, num_threads, flag)
        }
    }

    /// Unpacks `bytes` of data from the local packet buffer at `target_offset` into
    /// `src + origin_offset`, waiting (at most `timeout` per packet) for `flag`.
    ///
    /// # Safety
    /// As [`MemoryChannelDeviceHandle::put_packets`].
    #[allow(clippy::too_many_arguments)] // mirrors the device function's arguments
    pub unsafe fn unpack_packets<P: HostPacket>(
        &self,
        target_offset: u64,
        origin_offset: u64,
        bytes: u64,
        thread_id: u32,
        num_threads: u32,
        flag: u32,
        timeout: Duration,
    ) -> Result<()> {
        let (p, s) = (
            nonnull("packet buffer", self.packet_buffer)?,
            nonnull("source", self.src)?,
        );
        // SAFETY: forwarded from the caller.
        unsafe {
            packet::copy_from_packets(
                s.add(origin_offset as usize),
                p.add(target_offset as usize).cast::<P>(),
                bytes,
                thread_id,
                num_threads,
                flag,
                timeout,
            )
        }
    }

    /// The payload words of packet `index` of the local packet buffer, once it carries `flag`.
    ///
    /// # Safety
    /// As [`MemoryChannelDeviceHandle::put_packets`].
    pub unsafe fn unpack_packet<P: HostPacket>(
        &self,
        index: u64,
        flag: u32,
        timeout: Duration,
    ) -> Result<[u32; 2]> {
        let p = nonnull("packet buffer", self.packet_buffer)?;
        // SAFETY: forwarded from the caller.
        unsafe { packet::read_packet(p.cast::<P>().cast_const(), index as usize, flag, timeout) }
    }
}
